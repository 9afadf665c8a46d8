"""sleuth: environments, agent loops and RL training for multi-turn, tool-using language-model agents.

Light on import: `import sleuth` (and so `import sleuth.verifiers`) loads no torch; it registers the
built-in envs with gymnasium (so `gymnasium.make("sleuth/DocRead-v0")` works after it) and loads the
rest of the API on first use.
"""

from sleuth.envs.registry import make, register, registered
from sleuth.tasks.base import Task
from sleuth.verifiers.base import Verdict

__version__ = "0.1.0"

_LAZY = {
    "ToolEnv": "sleuth.envs.base", "Harness": "sleuth.envs.harness", "tool": "sleuth.envs.tools",
    "ToolError": "sleuth.envs.tools", "Trajectory": "sleuth.agents.trajectory", "Turn": "sleuth.agents.trajectory",
    "load_tasks": "sleuth.tasks.registry", "evaluate": "sleuth.agents.eval.api",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'sleuth' has no attribute {name!r}")


__all__ = ["Task", "Verdict", "make", "register", "registered", *_LAZY]
