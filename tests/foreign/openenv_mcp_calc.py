"""A pure-Python OpenEnv MCP env for the tests (openenv-core ships none): add two numbers with the `add` tool,
then `submit` the sum; reward 1.0 for the right sum. The numbers follow the reset seed."""

from __future__ import annotations

import random
from typing import Any

from fastmcp import FastMCP
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class CalcObservation(Observation):
    question: str = Field(default="", description="what to compute")


class CalcEnvironment(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        mcp = FastMCP("calc")

        @mcp.tool
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        @mcp.tool
        def submit(answer: int) -> str:
            """Submit the final answer."""
            return "submitted"

        super().__init__(mcp)
        self._state = State()
        self.a = self.b = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> CalcObservation:
        rng = random.Random(seed)
        self.a, self.b = rng.randint(100, 999), rng.randint(100, 999)
        self._state = State(episode_id=episode_id, step_count=0)
        return CalcObservation(question=f"What is {self.a} + {self.b}? Use the tools.")

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return self._scored(action, super().step(action, timeout_s=timeout_s, **kwargs))

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        """What openenv-core's server calls (the in-process env is stepped with `step`)."""
        return self._scored(action, await super().step_async(action, timeout_s=timeout_s, **kwargs))

    def _scored(self, action: Action, obs: Observation) -> Observation:
        if isinstance(action, CallToolAction) and action.tool_name == "submit" and isinstance(obs, CallToolObservation):
            obs.done = True
            obs.reward = 1.0 if action.arguments.get("answer") == self.a + self.b else 0.0
        return obs

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return CalcObservation(question="only MCP tools here", done=False, reward=0.0)

    @property
    def state(self) -> State:
        return self._state
