"""verifiers envs where the PyPI `verifiers` does not import (sleuth's main venv): a `RemoteEnv` session on a server
in verifiers' own venv (`venv_server.py`)."""

from __future__ import annotations

from typing import Any

from sleuth.envs.families.venv_server import ForeignVenv
from sleuth.envs.families.venv_server import remote_env as venv_remote_env
from sleuth.envs.remote import RemoteEnv

VERIFIERS = ForeignVenv("verifiers", "SLEUTH_VERIFIERS_PYTHON", ".venv-verifiers", "verifiers",
                        "verifiers 0.4.0 pins openai<3 and mcp==2.0.0")


def verifiers_python() -> str:
    """$SLEUTH_VERIFIERS_PYTHON, else the repository's `.venv-verifiers` (`make verifiers`)."""
    return VERIFIERS.python()


def remote_env(env_id: str, env_args: dict[str, Any]) -> RemoteEnv:
    timeout = float(env_args.get("timeout_s", 600.0)) + 30.0  # the server's own wait for the harness, and more
    return venv_remote_env(VERIFIERS, env_id, env_args, timeout)
