"""sleuth's tool envs in GEM's registry: after `import sleuth.envs.outbound.gem`, `gem.make("sleuth:DocRead-v0",
tasks="hotpotqa:dev")` builds one (any env registered with sleuth, plugins included: `sleuth:<id>`; call
`register_envs()` again for envs registered later). GEM has no plugin hook of its own (its registry is filled
when `gem` is imported), so this one import is the hook.

A GEM env is a Gym 5-tuple over text: `reset(seed)` gives the env's system message (instructions, tools, the
tool-call format) and the task's question as one observation, as GEM's own envs give their instructions;
`step(reply)` takes the model's whole reply, parsed by the env's harness, and returns the env's observation; the
reward is the verifier's score on the step that ends the episode. `reset(seed=i)` plays task `i % n`."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from sleuth.envs.families.base import require
from sleuth.envs.outbound.session import ToolSession
from sleuth.envs.registry import NAMESPACE, registered
from sleuth.tasks.base import Task

require("gem", "gem outbound registration", "gem-llm")

import gem  # noqa: E402
from gem.envs.registration import ENV_REGISTRY  # noqa: E402

PREFIX = "sleuth:"


class SleuthGemEnv(gem.Env):
    def __init__(self, env_id: str, tasks: str | Sequence[Task], **env_args: Any):
        self.session = ToolSession(env_id, tasks, **env_args)

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        turn = self.session.reset(seed=seed)
        info = {"task_id": turn.details["task_id"], "tools": self.session.tool_schemas()}
        return f"{self.session.system}\n\n{turn.text}", info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        turn = self.session.act(action)
        info = {"error": turn.error, **turn.details}
        return turn.text, turn.reward, turn.terminated, turn.truncated, info

    def close(self) -> None:
        self.session.close()


def gem_id(env_id: str) -> str:
    """`sleuth/DocRead-v0` → `sleuth:DocRead-v0`; an env of another namespace keeps it (`sleuth:myns/Env-v0`)."""
    return PREFIX + env_id.removeprefix(f"{NAMESPACE}/")


def register_envs() -> list[str]:
    """Give GEM every env registered with sleuth that it lacks; returns the GEM ids added."""
    added = []
    for env_id in registered():
        name = gem_id(env_id)
        if name not in ENV_REGISTRY:
            gem.register(name, partial(SleuthGemEnv, env_id))
            added.append(name)
    return added


register_envs()
