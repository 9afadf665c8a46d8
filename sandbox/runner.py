"""Run an untrusted program: namespaces from bubblewrap (no network, private /tmp and working dir,
read-only system, nothing of the project or the user's files), an unprivileged uid, rlimits for CPU,
memory, file size and open files, a cgroup (or RLIMIT_NPROC) process cap, a wall-clock timeout, bounded
output, and every process of the run killed at the end.

Without bwrap the same run falls back to rlimits + a private temp dir, with a loud warning that is
also recorded in every result (`isolation="rlimits"`)."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

from sleuth.sandbox.limits import Limits, RunResult, classify

NOBODY = 65534
_PIDS_CGROUPS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))
_FALLBACK_WARNING = ("bubblewrap (bwrap) not found: sandboxed code runs with rlimits and a private temp dir "
                     "only, without network or filesystem isolation. Install it: apt-get install bubblewrap")


def _pids_cgroup_root() -> Path | None:
    """A writable cgroup directory whose children get the pids controller (v1 `pids` or v2 unified)."""
    for root in _PIDS_CGROUPS:
        if not (root / "cgroup.procs").exists():
            continue
        probe = root / f"sleuth-probe-{os.getpid()}"
        try:
            probe.mkdir()
        except OSError:
            continue
        try:
            if (probe / "pids.max").exists():
                return root
        finally:
            probe.rmdir()
    return None


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
        self.as_root = os.geteuid() == 0
        self.setpriv = shutil.which("setpriv") if self.as_root else None
        self.cgroup_root = _pids_cgroup_root() if self.as_root else None
        if self.as_root and not self.setpriv:
            self.warnings.append("setpriv not found: sandboxed code runs as root inside its namespaces")

    # -- public ---------------------------------------------------------------------------------
    def run_python(self, code: str, files: Mapping[str, str] | None = None, stdin: str = "",
                   limits: Limits | None = None) -> RunResult:
        """Run `code` as main.py in a fresh working directory (with any extra `files` beside it)."""
        return self.run([self.python, *self.python_flags, "main.py"], {"main.py": code, **(files or {})}, stdin, limits)

    def run(self, argv: Sequence[str], files: Mapping[str, str] | None = None, stdin: str = "",
            limits: Limits | None = None) -> RunResult:
        lim = limits or self.limits
        work = Path(tempfile.mkdtemp(prefix="sleuth-sbx-"))
        io_dir = Path(tempfile.mkdtemp(prefix="sleuth-sbx-io-"))
        cgroup = self._make_cgroup(lim)
        try:
            self._write_files(work, files or {})
            with open(io_dir / "out", "w+b") as out, open(io_dir / "err", "w+b") as err:
                start = time.perf_counter()
                timed_out = False
                proc = subprocess.Popen(
                    self._command(argv, work), cwd=work, env=self._env(work), stdin=subprocess.PIPE,
                    stdout=out, stderr=err, start_new_session=True, preexec_fn=self._child_setup(lim, cgroup),
                )
                try:
                    proc.communicate(stdin.encode(), timeout=lim.wall_s)
                except subprocess.TimeoutExpired:
                    timed_out = True
                finally:
                    self._kill_all(proc, cgroup)
                wall = time.perf_counter() - start
                stdout, cut_out = _read_capped(out, lim.output_bytes)
                stderr, cut_err = _read_capped(err, lim.output_bytes)
        finally:
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(io_dir, ignore_errors=True)
            if cgroup is not None:
                _remove_cgroup(cgroup)
        status, sig = classify(proc.returncode, timed_out, stderr)
        return RunResult(status, None if timed_out else proc.returncode, sig, stdout, stderr, round(wall, 4),
                         self.isolation, cut_out or cut_err, list(self.warnings))

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

    def _env(self, work: Path) -> dict[str, str]:
        home = "/work" if self.bwrap else str(work)
        return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}

    def _command(self, argv: Sequence[str], work: Path) -> list[str]:
        drop = [self.setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] if self.setpriv else []
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
        cmd += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--bind", str(work), "/work",
                "--chdir", "/work"]
        return [*cmd, *drop, *argv]

    def _child_setup(self, lim: Limits, cgroup: Path | None):
        def setup() -> None:  # runs in the child between fork and exec
            if cgroup is not None:
                with open(cgroup / "cgroup.procs", "w") as f:
                    f.write(str(os.getpid()))
            else:  # inherited by the unprivileged uid after setpriv (root itself is exempt)
                resource.setrlimit(resource.RLIMIT_NPROC, (lim.processes, lim.processes))
            resource.setrlimit(resource.RLIMIT_CPU, (lim.cpu_s, lim.cpu_s + 1))
            mem = lim.memory_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
            size = lim.file_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
            resource.setrlimit(resource.RLIMIT_NOFILE, (lim.open_files, lim.open_files))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

        return setup

    def _make_cgroup(self, lim: Limits) -> Path | None:
        if self.cgroup_root is None:
            return None
        cg = self.cgroup_root / f"sleuth-{uuid.uuid4().hex[:12]}"
        try:
            cg.mkdir()
            (cg / "pids.max").write_text(str(lim.processes))
            return cg
        except OSError:
            return None

    def _kill_all(self, proc: subprocess.Popen, cgroup: Path | None) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if cgroup is not None:  # catches anything that left the process group (setsid, double fork)
            for _ in range(50):
                pids = [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.002)
        proc.wait()


def _read_capped(f, limit: int) -> tuple[str, bool]:
    size = f.seek(0, os.SEEK_END)
    f.seek(0)
    data = f.read(limit)
    text = data.decode("utf-8", errors="replace")
    if size > limit:
        return text + f"\n[... {size - limit} more bytes cut]", True
    return text, False


def _remove_cgroup(cg: Path) -> None:
    for _ in range(100):
        try:
            cg.rmdir()
            return
        except OSError:
            time.sleep(0.005)
