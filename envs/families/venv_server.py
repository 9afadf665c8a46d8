"""A family whose library clashes with sleuth's main venv runs in its own venv: one `sleuth serve env --env FAMILY:*`
per venv and process there, serving every env of the family this process makes, and a `RemoteEnv` session on it per
env made here (verifiers, BFCL). One server, not one per env id: each costs an interpreter that imports the family's
library (~8 s and ~150 MB for verifiers), and an eval over a benchmark's categories makes many ids.

The server runs `python -P` from a scratch directory, so neither the working directory nor a script's folder goes
on its sys.path: from the repository root, sleuth's own `verifiers/` folder would shadow the PyPI package. It is
started on first use, killed (its whole process group) when this process exits, and started again by the next
`make` after it died; an episode on a dead server fails as an env failure and is retried by the same command."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sleuth.core.net import free_port, wait_healthy
from sleuth.envs.families.base import MissingExtraError
from sleuth.envs.remote import RemoteEnv, RemoteEnvError

START_TIMEOUT_S = 120.0
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ForeignVenv:
    """Where a family's own venv is: `$<variable>` names its Python, else `<repo>/<venv>/bin/python` (built by
    `make <target>`); `why` says what clashes. `server_env`: variables the server process gets unless already set."""

    family: str
    variable: str
    venv: str
    target: str
    why: str
    server_env: Mapping[str, str] = field(default_factory=dict)

    def python(self) -> str:
        given = os.environ.get(self.variable)
        local = REPO / self.venv / "bin" / "python"
        python = given or (str(local) if local.exists() else None)
        if python is None or not Path(python).exists():
            raise MissingExtraError(f"{self.family}: envs run in their own venv ({self.why}): `make {self.target}` "
                                    f"builds {self.venv}, or set ${self.variable} to a Python with "
                                    f"`sleuth[{self.family}]`")
        return python


_servers: dict[str, tuple[subprocess.Popen, str, Path]] = {}  # by family
_lock = threading.Lock()


def _start(venv: ForeignVenv) -> tuple[subprocess.Popen, str, Path]:
    python, port = venv.python(), free_port()
    workdir = Path(tempfile.mkdtemp(prefix=f"sleuth-{venv.family}-"))
    log = workdir / "server.log"
    env = {**{k: v.format(workdir=workdir) for k, v in venv.server_env.items()}, **os.environ}
    with open(log, "wb") as out:
        proc = subprocess.Popen([python, "-P", "-m", "sleuth.cli", "serve", "env", "--env", f"{venv.family}:*",
                                 "--port", str(port)], cwd=workdir, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, START_TIMEOUT_S, proc)
    except (RuntimeError, TimeoutError) as e:
        _kill(proc)
        said = log.read_text(errors="replace").strip().splitlines()
        shutil.rmtree(workdir, ignore_errors=True)
        if proc.returncode == 2 and said:  # the server refused: its one line (`cannot serve ...`) says why
            raise ValueError(said[-1].removeprefix("error: ")) from None
        raise RuntimeError(f"the {venv.family} env server ({python}) did not start: {e}: "
                           f"{' | '.join(said[-3:])}") from None
    return proc, url, workdir


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(30)


def _stop(server: tuple[subprocess.Popen, str, Path]) -> None:
    _kill(server[0])
    shutil.rmtree(server[2], ignore_errors=True)  # its log and working directory


@atexit.register
def _stop_all() -> None:
    with _lock:
        for server in _servers.values():
            _stop(server)
        _servers.clear()


def server_process(venv: ForeignVenv) -> subprocess.Popen | None:
    """The server process of `venv`'s family, if one was started."""
    running = _servers.get(venv.family)
    return running[0] if running else None


def server_url(venv: ForeignVenv) -> str:
    """The running server of `venv`'s family, started (again) if it is not running."""
    with _lock:
        running = _servers.get(venv.family)
        if running is None or running[0].poll() is not None:
            if running is not None:
                _stop(running)
            _servers[venv.family] = running = _start(venv)
        return running[1]


def remote_env(venv: ForeignVenv, env_id: str, env_args: dict[str, Any], timeout: float) -> RemoteEnv:
    """A session on the family's server for `FAMILY:env_id`; env_args build the env there (they must be JSON)."""
    json.dumps(env_args)  # refuse what cannot travel, here, in one line
    env = RemoteEnv(server_url(venv), timeout=timeout, env_id=f"{venv.family}:{env_id}", **env_args)
    try:
        env.open()  # the env is built there now: a bad id or argument is one line here, before any episode
    except RemoteEnvError as e:
        env.close()
        if e.status == 422 and e.detail:  # the server's own line: `cannot build FAMILY:ID: ...`
            raise ValueError(e.detail) from None
        raise
    return env
