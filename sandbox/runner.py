"""Run an untrusted program: namespaces from bubblewrap (no network, private /tmp and working dir,
read-only system, nothing of the project or the user's files), a fresh unprivileged uid per run, rlimits
for CPU, memory, file size, open files and processes, a wall-clock timeout, bounded output, and every
process of the run killed at the end.

Without bwrap the same run falls back to rlimits + a private temp dir, with a loud warning that is
also recorded in every result (`isolation="rlimits"`)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

from sleuth.sandbox.limits import Limits, RunResult, classify

# Each concurrent run gets its own unprivileged uid (no passwd entry needed), so RLIMIT_NPROC caps that
# run's processes alone and every process it left behind can be found and killed by uid. A cgroup pids
# controller would also do, but attaching to a v1 cgroup costs ~14 ms a run (measured): more than bwrap.
# The uids of a process are a block of its own (by pid): two processes sandboxing at once must never
# share a uid, or the clean-up of one run would kill the other's.
UID_BASE = 1_800_000_000  # + at most 2**22 * 64: stays below 2**31
UIDS_PER_PROCESS = 64
_uid_lock = threading.Lock()
_uids_in_use: set[int] = set()
_FALLBACK_WARNING = ("bubblewrap (bwrap) not found: sandboxed code runs with rlimits and a private temp dir "
                     "only, without network or filesystem isolation. Install it: apt-get install bubblewrap")


def _system_python() -> str:
    """An interpreter an unprivileged uid can run (pyenv builds under /root are not readable by it)."""
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(cand, os.X_OK):
            return cand
    return sys.executable


class Sandbox:
    def __init__(self, limits: Limits | None = None, python: str | None = None, isolation: str = "auto",
                 site_packages: bool = False):
        if isolation not in ("auto", "bwrap", "rlimits"):
            raise ValueError(f"isolation must be auto, bwrap or rlimits, not {isolation!r}")
        self.limits = limits or Limits()
        self.bwrap = shutil.which("bwrap") if isolation != "rlimits" else None
        if isolation == "bwrap" and not self.bwrap:
            raise FileNotFoundError("isolation='bwrap' but bwrap is not installed (apt-get install bubblewrap)")
        self.isolation = "bwrap" if self.bwrap else "rlimits"
        self.warnings = [] if self.bwrap else [_FALLBACK_WARNING]
        if not self.bwrap and isolation == "auto":
            warnings.warn(_FALLBACK_WARNING, RuntimeWarning, stacklevel=2)
        self.python = python or _system_python()
        self.python_flags = ["-I"] if site_packages else ["-I", "-S"]  # -S: start-up 5x faster (no site)
        self.prlimit = shutil.which("prlimit")
        if self.prlimit is None:
            raise FileNotFoundError("the sandbox needs prlimit (util-linux) to set resource limits")
        self.as_root = os.geteuid() == 0
        self.setpriv = shutil.which("setpriv") if self.as_root else None
        if self.as_root and not self.setpriv:
            self.warnings.append("setpriv not found: sandboxed code runs as root inside its namespaces")

    # -- public ---------------------------------------------------------------------------------
    def run_python(self, code: str, files: Mapping[str, str] | None = None, stdin: str = "",
                   limits: Limits | None = None) -> RunResult:
        """Run `code` as main.py in a fresh working directory (with any extra `files` beside it)."""
        return self.run([self.python, *self.python_flags, "main.py"], {"main.py": code, **(files or {})}, stdin, limits)

    def run(self, argv: Sequence[str], files: Mapping[str, str] | None = None, stdin: str = "",
            limits: Limits | None = None, mounts: Mapping[str, str | Path] | None = None,
            collect: Sequence[str] = (), cwd: str = "", env: Mapping[str, str] | None = None) -> RunResult:
        """`mounts` maps a name under the working directory to a host folder shown read-only there (a
        repository, a virtual environment); `collect` names files the run writes in its working directory
        that come back in `RunResult.files`; `cwd` is a folder under the working directory to start in;
        `env` adds variables. "{work}" in `argv` and `env` stands for the working directory as the program
        sees it ("/work" under bwrap)."""
        lim = limits or self.limits
        work = Path(tempfile.mkdtemp(prefix="sleuth-sbx-"))
        io_dir = Path(tempfile.mkdtemp(prefix="sleuth-sbx-io-"))
        uid = _acquire_uid() if self.setpriv else None
        collected: dict[str, bytes] = {}
        try:
            self._write_files(work, files or {})
            binds = self._mounts(work, mounts or {})
            start_dir = _inside(work, cwd)
            seen = "/work" if self.bwrap else str(work)
            argv = [a.replace("{work}", seen) for a in argv]
            extra_env = {k: v.replace("{work}", seen) for k, v in (env or {}).items()}
            with open(io_dir / "out", "w+b") as out, open(io_dir / "err", "w+b") as err:
                start = time.perf_counter()
                proc = subprocess.Popen(
                    [*self._limits_prefix(lim, uid), *self._command(argv, work, uid, binds, cwd)],
                    cwd=start_dir, env={**self._env(work), **extra_env}, stdin=subprocess.PIPE, stdout=out, stderr=err,
                    start_new_session=True,
                )
                # A timer thread kills the run at the deadline, so waiting is one blocking waitpid
                # (Popen.wait(timeout=...) polls with sleeps: ~25 ms lost per run).
                fired = threading.Event()

                def deadline() -> None:
                    fired.set()
                    _killpg(proc.pid)

                timer = threading.Timer(lim.wall_s, deadline)
                timer.start()
                try:
                    try:
                        proc.stdin.write(stdin.encode())
                        proc.stdin.close()
                    except OSError:  # the program exited or closed stdin without reading it
                        pass
                    proc.wait()
                finally:
                    timer.cancel()
                    timed_out = fired.is_set()
                    _killpg(proc.pid)
                    if uid is not None:
                        _kill_uid(uid)  # anything that left the process group (setsid, double fork)
                    proc.wait()
                wall = time.perf_counter() - start
                stdout, cut_out = _read_capped(out, lim.output_bytes)
                stderr, cut_err = _read_capped(err, lim.output_bytes)
            for name in collect:
                path = _inside(work, name)
                if path.is_file() and not path.is_symlink():
                    collected[name] = path.read_bytes()
        finally:
            if uid is not None:
                _release_uid(uid)
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(io_dir, ignore_errors=True)
        status, sig = classify(proc.returncode, timed_out, stderr)
        return RunResult(status, None if timed_out else proc.returncode, sig, stdout, stderr, round(wall, 4),
                         self.isolation, cut_out or cut_err, list(self.warnings), collected)

    # -- internals --------------------------------------------------------------------------------
    def _write_files(self, work: Path, files: Mapping[str, str]) -> None:
        for name, content in files.items():
            path = (work / name).resolve()
            if work.resolve() not in path.parents:
                raise ValueError(f"sandbox file {name!r} would land outside the working directory")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content, encoding="utf-8")
            path.chmod(0o644)
        for d in [work, *[p for p in work.rglob("*") if p.is_dir()]]:
            d.chmod(0o777)  # the unprivileged uid writes here

    def _mounts(self, work: Path, mounts: Mapping[str, str | Path]) -> list[tuple[str, str]]:
        """(host folder, path inside) pairs. Without bwrap a mount is a symlink (writable: the fallback's
        warning already says there is no filesystem isolation)."""
        binds = []
        for name, host in mounts.items():
            host = Path(host).resolve()
            if not host.is_dir():
                raise FileNotFoundError(f"sandbox mount {name!r}: {host} is not a folder")
            target = _inside(work, name)
            if self.bwrap:
                target.mkdir(parents=True, exist_ok=True)
                binds.append((str(host), "/work/" + str(target.relative_to(work))))
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.symlink_to(host, target_is_directory=True)
        return binds

    def _env(self, work: Path) -> dict[str, str]:
        home = "/work" if self.bwrap else str(work)
        return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}

    def _command(self, argv: Sequence[str], work: Path, uid: int | None, binds: Sequence[tuple[str, str]] = (),
                 cwd: str = "") -> list[str]:
        drop = [self.setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups"] if uid is not None else []
        if not self.bwrap:
            return [*drop, *argv]
        cmd = [self.bwrap, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
               "--unshare-cgroup-try", "--die-with-parent", "--new-session",
               "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
        for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
            if os.path.islink(d):
                cmd += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                cmd += ["--ro-bind", d, d]
        prefix = os.path.realpath(os.path.dirname(os.path.dirname(self.python)))
        if not prefix.startswith("/usr"):  # e.g. a pyenv build: show only its own tree
            cmd += ["--ro-bind", prefix, prefix]
        cmd += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/dev/shm",
                "--perms", "1777", "--tmpfs", "/tmp", "--bind", str(work), "/work"]
        for host, inside in binds:
            cmd += ["--ro-bind", host, inside]
        cmd += ["--chdir", "/work/" + cwd if cwd else "/work"]
        return [*cmd, *drop, *argv]

    def _limits_prefix(self, lim: Limits, uid: int | None) -> list[str]:
        """rlimits set by `prlimit` in front of the command rather than in a preexec_fn: a preexec_fn
        forces a full fork() of this (possibly large) process, while without one subprocess can vfork."""
        # RLIMIT_NPROC counts the processes of the real uid. Root is exempt, so the cap bites once setpriv
        # has switched to the run's own uid; without root it counts the caller's processes, so allow those.
        nproc = lim.processes if uid is not None else _own_processes() + lim.processes
        mem, size = lim.memory_mb * 1024 * 1024, lim.file_mb * 1024 * 1024
        return [self.prlimit, f"--nproc={nproc}", f"--cpu={lim.cpu_s}:{lim.cpu_s + 1}", f"--as={mem}",
                f"--fsize={size}", f"--nofile={lim.open_files}", "--core=0", "--"]


def _inside(work: Path, name: str) -> Path:
    """`work/name`, refusing names that climb out (checked on the text: a mount may be a symlink)."""
    norm = os.path.normpath(name or ".")
    if os.path.isabs(norm) or norm == ".." or norm.startswith("../"):
        raise ValueError(f"sandbox path {name!r} would land outside the working directory")
    return work / norm


def _acquire_uid() -> int:
    base = UID_BASE + (os.getpid() % 4_194_304) * UIDS_PER_PROCESS  # pid_max is at most 2**22
    with _uid_lock:
        for uid in range(base, base + UIDS_PER_PROCESS):
            if uid not in _uids_in_use:
                _uids_in_use.add(uid)
                return uid
    raise RuntimeError(f"more than {UIDS_PER_PROCESS} sandboxed runs at once in one process")


def _release_uid(uid: int) -> None:
    with _uid_lock:
        _uids_in_use.discard(uid)


def _pids_of(uid: int) -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _kill_uid(uid: int) -> None:
    for _ in range(100):
        pids = _pids_of(uid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.001)


def _own_processes() -> int:
    return len(_pids_of(os.getuid()))


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_capped(f, limit: int) -> tuple[str, bool]:
    size = f.seek(0, os.SEEK_END)
    f.seek(0)
    data = f.read(limit)
    text = data.decode("utf-8", errors="replace")
    if size > limit:
        return text + f"\n[... {size - limit} more bytes cut]", True
    return text, False
