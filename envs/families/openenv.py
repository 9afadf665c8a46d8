"""`openenv:<module>:<Environment class>` (built in this process) and `openenv:http://HOST:PORT` (a running
OpenEnv server, one WebSocket session per env, through openenv-core's own `GenericEnvClient`): an OpenEnv env
whose action model becomes one tool. The policy calls it in a tool-call harness (`json` by default, or `text`);
its arguments are checked against the action's JSON schema as sleuth's own tools are, and a malformed call is
an observation that says what was wrong (it counts against `max_turns`), never an exception. Each observation
is the observation model's fields other than `done`, `reward` and `metadata` (the one field's text, else JSON);
the score is the episode's return.

The action model of an in-process env is its `Environment[Action, Observation, State]` type argument, or
`action="module:Class"` in env_args; a server's comes from its `/schema`. Seeds reach OpenEnv's
`reset(seed=...)`. MCP tools of an `MCPEnvironment` are not offered as tools yet."""

from __future__ import annotations

import json
import re
import typing
from typing import Any

import httpx

from sleuth.envs.families.base import EnvFailure, Move, TextGameEnv, require
from sleuth.envs.harness import Harness
from sleuth.envs.tools import Tool
from sleuth.registry import import_target
from sleuth.tasks.base import Task

_HIDDEN = {"done", "reward", "metadata"}  # observation fields the loop reads itself (or nobody reads)
INSTRUCTIONS = "You act in an environment by calling its tool, one call per reply."


def tool_name(title: str) -> str:
    """`GuessAction` → `guess`: the action model's name, snake_case, without `Action`."""
    base = re.sub(r"Action$", "", title) or title
    return re.sub(r"(?<!^)(?=[A-Z])", "_", base).lower() or "act"


def action_tool(schema: dict[str, Any], call: Any) -> Tool:
    """The tool a policy calls: the action's JSON schema (without OpenEnv's `metadata`) and `call(arguments)`."""
    props = {k: v for k, v in (schema.get("properties") or {}).items() if k != "metadata"}
    params = {"type": "object", "properties": props,
              "required": [r for r in schema.get("required", []) if r in props]}
    return Tool(tool_name(schema.get("title", "Action")), call, schema.get("description") or "Take an action.",
                params)


def observation_text(fields: dict[str, Any]) -> str:
    shown = {k: v for k, v in fields.items() if k not in _HIDDEN}
    if len(shown) == 1:
        value = next(iter(shown.values()))
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return json.dumps(shown, ensure_ascii=False, default=str)


def _action_model(env_cls: type, given: str | None) -> type:
    if given:
        return import_target(given)
    from openenv.core.env_server.types import Action

    for base in getattr(env_cls, "__orig_bases__", ()):  # Environment[Act, Obs, State]: the class's declaration
        for arg in typing.get_args(base):
            if isinstance(arg, type) and issubclass(arg, Action):
                return arg
    raise ValueError(f"{env_cls.__name__} declares no Action type (Environment[Action, Observation, State]): pass "
                     "env_args action=module:ActionClass")


class OpenEnvEnv(TextGameEnv):
    family = "openenv"
    harnesses = ("json", "text")

    def __init__(self, env_id: str, *, action: str | None = None, timeout_s: float = 60.0, **kwargs: Any):
        require("openenv.core", "openenv", "openenv-core")
        own = {k: kwargs.pop(k) for k in ("harness", "max_turns", "system_prompt", "tasks") if k in kwargs}
        super().__init__(env_id, **own)
        self.remote = env_id.startswith(("http://", "https://"))
        self.kwargs = kwargs
        if self.remote:
            from openenv.core.generic_client import GenericEnvClient

            schema = self._schema(env_id, timeout_s)
            self.client = GenericEnvClient(base_url=env_id, message_timeout_s=timeout_s).sync()
            self.tool = action_tool(schema, lambda **args: self.client.step(args))
        else:
            env_cls = import_target(env_id)
            self.model = _action_model(env_cls, action)
            self.env = env_cls(**kwargs)
            self.tool = action_tool(self.model.model_json_schema(), lambda **args: self.env.step(self.model(**args)))
        self.harness = Harness(self.format, budget=self.max_turns)
        tools = {self.tool.name: self.tool}
        self.system_prompt = self.system_prompt or self.harness.system_message(INSTRUCTIONS, tools)

    @staticmethod
    def _schema(url: str, timeout_s: float) -> dict[str, Any]:
        try:
            resp = httpx.get(f"{url.rstrip('/')}/schema", timeout=timeout_s)
            resp.raise_for_status()
            return resp.json()["action"]
        except (httpx.HTTPError, KeyError, ValueError) as e:
            raise EnvFailure(f"openenv:{url} gave no action schema at /schema: {type(e).__name__}: {e}") from None

    def env_args(self) -> dict[str, Any]:
        return dict(self.kwargs)

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [self.tool.schema()]

    def begin(self, task: Task, seed: int) -> Move:
        return self._move(self.client.reset(seed=seed) if self.remote else self.env.reset(seed=seed))

    def advance(self, action: str) -> Move:
        parsed = self.harness.parser.parse(action, {self.tool.name: self.tool})
        call = parsed.calls[0] if parsed.calls else None
        error = parsed.error or (None if call is None or call.name == self.tool.name else
                                 f"unknown tool {call.name!r}; the tool is {self.tool.name!r}")
        if error is None:
            args, error = self.tool.check_arguments(call.arguments)
        if error is not None:
            return Move(self.harness.parser.wrap(error), details={"error": error, "tool_call": None})
        try:
            out = self.tool.fn(**args)
        except (ValueError, TypeError) as e:  # the action model refused the arguments (pydantic's ValidationError)
            message = f"the action was refused: {str(e).splitlines()[0]}"
            return Move(self.harness.parser.wrap(message), details={"error": message, "tool_call": call.to_dict()})
        move = self._move(out)
        move.details = {"tool_call": call.to_dict()}
        move.observation = self.harness.clip(move.observation)
        return move

    def _move(self, result: Any) -> Move:
        """An OpenEnv observation (in process) or `StepResult` (client) as a Move."""
        if self.remote:
            fields, reward, done = dict(result.observation or {}), result.reward, result.done
        else:
            fields, reward, done = result.model_dump(), result.reward, result.done
        return Move(observation_text(fields), float(reward or 0.0), bool(done))

    def close(self) -> None:
        if self.remote:
            self.client.close()
        else:
            self.env.close()


def make(env_id: str, **env_args: Any) -> OpenEnvEnv:
    return OpenEnvEnv(env_id, **env_args)
