"""A sleuth tool env as an OpenEnv server (`sleuth serve openenv`): openenv-core's own `create_app` (HTTP `/reset
/step /state /schema`, WebSocket sessions at `/ws`), one `ToolSession` per session. Actions are OpenEnv's MCP
action types (RFC 003): `ListToolsAction` lists the env's tools, `CallToolAction(tool_name, arguments)` calls one,
so openenv-core's `MCPToolClient` and `GenericEnvClient` drive it unchanged.

Observations are `SleuthObservation` (a `CallToolObservation` with the task's id and the question): reset gives the
question in `result` and `prompt`; a call gives the tool's observation in `result`, and, on the call that ends
the episode, the verifier's score as `reward` with `done`. A call the env rejects (unknown tool, bad arguments)
is the env's own observation, with `call_error` set; it counts against the turn budget as it does in sleuth, and
is not OpenEnv's `error` (a transport or framework failure, which `MCPToolClient.call_tool` raises on): the model
made the mistake and is told so. An env that raises fails the request, never a scored step."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from sleuth.core.args import parse_kv
from sleuth.core.errors import BadInput
from sleuth.envs.families.base import require
from sleuth.envs.outbound.session import ToolSession, Turn, load_task_list
from sleuth.servers.base import Server
from sleuth.tasks.base import Task

require("openenv.core", "openenv outbound server", "openenv-core")

from openenv.core.env_server.http_server import create_app as openenv_app  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.mcp_types import (  # noqa: E402
    CallToolAction,
    CallToolObservation,
    ListToolsAction,
    ListToolsObservation,
    Tool,
)
from openenv.core.env_server.types import State  # noqa: E402
from pydantic import Field  # noqa: E402


class SleuthObservation(CallToolObservation):
    """An OpenEnv observation of a sleuth env: the tool's result (or, at reset, the question)."""

    task_id: str = Field(default="", description="the id of the episode's task")
    prompt: str = Field(default="", description="the task's question (set at reset)")
    call_error: str | None = Field(default=None, description="the call's mistake, as `result` tells the model")


def _tool(schema: dict[str, Any]) -> Tool:
    fn = schema["function"]
    return Tool(name=fn["name"], description=fn["description"], input_schema=fn["parameters"])


class SleuthEnvironment(Environment[CallToolAction, SleuthObservation, State]):
    """One OpenEnv session over a `ToolSession`. `reset(seed=i)` plays task `i % n`; `reset(task_id=...)` a named
    one."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, session: ToolSession):
        super().__init__()
        self.session = session
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, task_id: str | None = None,
              **kwargs: Any) -> SleuthObservation:
        turn = self.session.reset(seed=seed, task_id=task_id)
        self._state = State(episode_id=episode_id, step_count=0)
        tid = turn.details["task_id"]
        return SleuthObservation(tool_name="", result=turn.text, prompt=turn.text, task_id=tid)

    def step(self, action: CallToolAction | ListToolsAction, timeout_s: float | None = None,
             **kwargs: Any) -> SleuthObservation | ListToolsObservation:
        if isinstance(action, ListToolsAction):
            return ListToolsObservation(tools=[_tool(s) for s in self.session.tool_schemas()])
        self._state.step_count += 1
        turn = self.session.call(action.tool_name, action.arguments)
        return self._observation(action.tool_name, turn)

    def _observation(self, name: str, turn: Turn) -> SleuthObservation:
        task_id = self.session.task.id if self.session.task else ""
        return SleuthObservation(tool_name=name, result=turn.text, call_error=turn.error, task_id=task_id,
                                 done=turn.done, reward=turn.reward)

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        self.session.close()


def create_app(env_id: str, tasks: str | Sequence[Task], max_sessions: int = 64, **env_args: Any):
    """The FastAPI app of openenv-core serving `env_id` over `tasks` (loaded once, shared by every session)."""
    loaded = load_task_list(tasks)
    ToolSession(env_id, loaded[:1], **env_args).close()  # a bad env id or argument fails here, not per session

    def factory() -> SleuthEnvironment:
        return SleuthEnvironment(ToolSession(env_id, loaded, **env_args))

    return openenv_app(factory, CallToolAction, SleuthObservation, env_name=env_id.replace("/", "_"),
                       max_concurrent_envs=max_sessions)


def build(args: argparse.Namespace) -> Server:
    """`sleuth serve openenv`'s server from its flags (`servers.catalog`)."""
    try:
        app = create_app(args.env, args.tasks, args.max_sessions, **parse_kv(args.env_arg))
    except Exception as e:  # a bad env id, task spec or argument: one line, not a traceback
        raise BadInput(f"cannot serve {args.env} as an OpenEnv env: {type(e).__name__}: {e}") from None
    return Server(app, f"serving {args.env} over {args.tasks} as an OpenEnv env on {{url}} "
                       f"(at most {args.max_sessions} sessions)")
