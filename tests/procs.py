"""The processes a test started: found through the process tree, so that tests running side by side (xdist) never
see, or kill, each other's Ray workers; and `sleuth` run in the test's own process where no signal must reach it."""

import os
import subprocess
import sys
import time
from pathlib import Path


def descendants(root: int, title: str) -> list[int]:
    """Pids of `root`'s descendants whose command line contains `title` (e.g. "ray::RolloutWorker")."""
    children: dict[int, list[int]] = {}
    cmds: dict[int, str] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmds[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # ended meanwhile
            continue
        children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(d.name))
    found, frontier = [], list(children.get(root, []))
    while frontier:
        pid = frontier.pop()
        if title in cmds.get(pid, ""):
            found.append(pid)
        frontier += children.get(pid, [])
    return sorted(found)


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def running(pid: int) -> bool:
    """Alive and not a zombie (a killed process waiting for its parent to reap it runs nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def command(pid: int) -> str:
    try:
        return (Path(f"/proc/{pid}") / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "(gone)"


class Watched:
    """A command run with every process of its tree remembered (`seen`), to check they are all gone at its end."""

    def __init__(self, cmd: list[str], log: Path, **popen: object):
        self.log = log
        self.proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, **popen)  # noqa: SIM115
        self.seen: set[int] = set()

    def look(self, title: str = "") -> list[int]:
        """The tree's processes now whose command line contains `title` (all of them remembered)."""
        self.seen.update(descendants(self.proc.pid, ""))
        return descendants(self.proc.pid, title)

    def wait(self, timeout: float) -> int:
        import time

        end = time.time() + timeout
        while self.proc.poll() is None and time.time() < end:
            self.look()
            time.sleep(0.2)
        return self.proc.wait(timeout=max(1.0, end - time.time()))

    def output(self) -> str:
        return self.log.read_text()

    def left(self, grace_s: float = 30.0, besides: tuple[str, ...] = ()) -> list[str]:
        """Processes of the tree still alive `grace_s` after the end at most, as "pid command" (none, when it
        cleaned up), those whose command contains one of `besides` aside."""
        import time

        def living() -> list[str]:
            out = [f"{p} {command(p)}" for p in self.seen if alive(p)]
            return [x for x in out if not any(b in x for b in besides)]

        end = time.time() + grace_s
        while living() and time.time() < end:
            time.sleep(0.5)
        return living()


def sleuth_here(*args: object, capfd=None, threads: int | None = None) -> subprocess.CompletedProcess:
    """`sleuth ARGS` run in this process as the command line runs it, for the runs no signal reaches: its imports are
    loaded already (seconds, where a new interpreter spends ~10 CPU s starting). With pytest's `capfd` (or `capsys`)
    its stdout and stderr come back (else they go to the test's captured output); `threads` caps torch's intra-op
    threads for the run (1: the tokens a `sleuth` subprocess under OMP_NUM_THREADS=1 samples)."""
    import torch

    from sleuth.cli.main import main

    argv = [str(a) for a in args]
    before = torch.get_num_threads()
    if capfd is not None:
        capfd.readouterr()
    try:
        if threads is not None:
            torch.set_num_threads(threads)
        code = main(argv)
    except SystemExit as e:  # argparse's own refusals exit
        code = e.code
    finally:
        torch.set_num_threads(before)
    out, err = capfd.readouterr() if capfd is not None else ("", "")
    return subprocess.CompletedProcess(argv, code, out, err)


def start_sleuth(args: list, log: Path) -> subprocess.Popen:
    """`sleuth ARGS` in a session of its own (for a signal to reach it alone), on one thread, outside any torch
    process group of the test's; stderr to `log` (a pipe nobody reads fills up and blocks the command)."""
    from sleuth.training.zero import DIST_VARS

    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS} | {"OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "sleuth.cli", *map(str, args)], env=env, stdout=subprocess.DEVNULL,
                            stderr=open(log, "w"), start_new_session=True)  # noqa: SIM115


def wait_for(pred, proc: subprocess.Popen, timeout: float = 300.0) -> None:
    """Until `pred()` holds; fails if `proc` ends first or `timeout` seconds pass."""
    end = time.time() + timeout
    while not pred():
        assert proc.poll() is None, "the command ended before the awaited moment"
        assert time.time() < end, "timed out"
        time.sleep(0.02)
