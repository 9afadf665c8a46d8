"""verifiers envs where the PyPI `verifiers` does not import (sleuth's main venv): one `sleuth serve env` per env id
and process, in verifiers' own venv, and a `RemoteEnv` session on it per env made.

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
from pathlib import Path
from typing import Any

from sleuth.envs.families.base import MissingExtraError
from sleuth.envs.remote import RemoteEnv, RemoteEnvError
from sleuth.net import free_port, wait_healthy

START_TIMEOUT_S = 120.0
_servers: dict[str, tuple[subprocess.Popen, str, Path]] = {}
_lock = threading.Lock()


def verifiers_python() -> str:
    """$SLEUTH_VERIFIERS_PYTHON, else the repository's `.venv-verifiers` (`make verifiers`)."""
    given = os.environ.get("SLEUTH_VERIFIERS_PYTHON")
    local = Path(__file__).resolve().parents[2] / ".venv-verifiers" / "bin" / "python"
    python = given or (str(local) if local.exists() else None)
    if python is None or not Path(python).exists():
        raise MissingExtraError("verifiers: envs run in verifiers' own venv (verifiers 0.4.0 pins openai<3 and "
                                "mcp==2.0.0): `make verifiers` builds .venv-verifiers, or set "
                                "$SLEUTH_VERIFIERS_PYTHON to a Python with `sleuth[verifiers]`")
    return python


def _start(env_id: str) -> tuple[subprocess.Popen, str, Path]:
    python, port = verifiers_python(), free_port()
    workdir = Path(tempfile.mkdtemp(prefix="sleuth-verifiers-"))
    log = workdir / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([python, "-P", "-m", "sleuth.cli", "serve", "env", "--env", f"verifiers:{env_id}",
                                 "--port", str(port)], cwd=workdir, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, START_TIMEOUT_S, proc)
    except (RuntimeError, TimeoutError) as e:
        _kill(proc)
        said = log.read_text(errors="replace").strip().splitlines()
        shutil.rmtree(workdir, ignore_errors=True)
        if proc.returncode == 2 and said:  # the server refused the env: its one line (`cannot serve ...`) says why
            raise ValueError(said[-1].removeprefix("error: ")) from None
        raise RuntimeError(f"the verifiers env server ({python}) did not start: {e}: {' | '.join(said[-3:])}") from None
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


def server_url(env_id: str) -> str:
    """The running server of `env_id`, started (again) if it is not running."""
    with _lock:
        running = _servers.get(env_id)
        if running is None or running[0].poll() is not None:
            if running is not None:
                _stop(running)
            _servers[env_id] = running = _start(env_id)
        return running[1]


def remote_env(env_id: str, env_args: dict[str, Any]) -> RemoteEnv:
    """A session on the env's server; env_args build the env there (they must be JSON)."""
    json.dumps(env_args)  # refuse what cannot travel, here, in one line
    timeout = float(env_args.get("timeout_s", 600.0)) + 30.0  # the server's own wait for the harness, and more
    env = RemoteEnv(server_url(env_id), timeout=timeout, **env_args)
    try:
        env.open()  # the env is built there now: a bad id or argument is one line here, before any episode
    except RemoteEnvError as e:
        env.close()
        raise ValueError(str(e)) from None
    return env
