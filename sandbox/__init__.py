"""Sandboxed execution of untrusted (model-written) programs. Depends on nothing else in sleuth, so both
envs and verifiers use it without importing each other."""

from sleuth.sandbox.limits import Limits, RunResult
from sleuth.sandbox.pool import SandboxPool
from sleuth.sandbox.runner import Sandbox

__all__ = ["Limits", "RunResult", "Sandbox", "SandboxPool"]
