"""`openenv:<module>:<Environment class>` (built in this process), `openenv:<module>:<app>` (a server module's
`create_app(...)` app, served in this process as deployed) and `openenv:http://HOST:PORT` (a running OpenEnv
server, one WebSocket session per episode, through openenv-core's own `GenericEnvClient`): an OpenEnv env
whose action model becomes one tool. The policy calls it in a tool-call harness (`json` by default, or `text`);
its arguments are checked against the action's JSON schema as sleuth's own tools are, and a malformed call is
an observation that says what was wrong (it counts against `max_turns`), never an exception. Each observation
is the observation model's fields other than `done`, `reward` and `metadata` (the one field's text, else JSON);
the score is the episode's return.

The action model of an in-process env is `action="module:Class"` in env_args, its `Environment[Action,
Observation, State]` type argument, or the annotation of `step`'s action (`openenv init`'s template declares no
generics); a server's comes from its `/schema`. Seeds reach OpenEnv's `reset(seed=...)` where reset takes one.

A server holds a session from an episode's reset to its end; one at capacity (`create_app`'s default is one
session) makes the next episodes wait for a free one (`sessions.py`). Refused replies never reach the env, so
`max_invalid_actions` of them in a row end the episode (`TextGameEnv`).

An MCP env (an `MCPEnvironment` in process; a server whose action is `CallToolAction`, which sleuth's own
`sleuth serve openenv` is) offers its MCP tools instead, each under its own name with its own input schema,
listed once when the env is built (`ListToolsAction`); a call is a `CallToolAction`, and its observation is the
tool's result (its data, else the text of its content) or `the tool failed: ...`."""

from __future__ import annotations

import contextlib
import inspect
import json
import re
import threading
import time
import typing
from typing import Any

import httpx

from sleuth.core.net import in_thread
from sleuth.core.registry import import_target
from sleuth.envs.families.base import EnvFailure, Move, TextGameEnv, require
from sleuth.envs.harness import Harness
from sleuth.envs.sessions import SESSION_WAIT_S, SessionGate, SessionsBusy, open_session
from sleuth.envs.tools import Tool
from sleuth.tasks.base import Task

_HIDDEN = {"done", "reward", "metadata"}  # observation fields the loop reads itself (or nobody reads)
INSTRUCTIONS = "You act in an environment by calling its tool, one call per reply."
MCP_INSTRUCTIONS = "You act in an environment by calling its tools, one call per reply."


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


def mcp_tool(listed: dict[str, Any], call: Any) -> Tool:
    """An MCP tool as listed (`name`, `description`, `input_schema`) and `call(name, arguments)` that runs it."""
    name = listed["name"]
    params = listed.get("input_schema") or {"type": "object", "properties": {}}
    return Tool(name, lambda **args: call(name, args), listed.get("description") or f"The {name} tool.", params)


def mcp_text(fields: dict[str, Any]) -> str:
    """A `CallToolObservation` (as JSON fields) as the policy reads it: the result's data, else the text of its
    content, else the result itself; a failed call says why."""
    if fields.get("error"):
        return f"the tool failed: {fields['error'].get('message', fields['error'])}"
    result = fields.get("result")
    if isinstance(result, dict):
        if result.get("data") is not None:
            data = result["data"]
            return data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, default=str)
        texts = [c.get("text", "") for c in result.get("content") or [] if isinstance(c, dict)]
        if texts:
            return "\n".join(texts)
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)


def observation_text(fields: dict[str, Any]) -> str:
    shown = {k: v for k, v in fields.items() if k not in _HIDDEN}
    if len(shown) == 1:
        value = next(iter(shown.values()))
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return json.dumps(shown, ensure_ascii=False, default=str)


def _action_model(env_cls: type, given: str | None) -> type:
    """The env's action model, where OpenEnv's own code would find it: `action=` given, the class's generic
    parameters (`Environment[Act, Obs, State]`), else the annotation of `step`'s action (what `openenv init`'s
    template writes: `def step(self, action: MyAction)`, no generic parameters)."""
    if given:
        return import_target(given)
    from openenv.core.env_server.types import Action

    for base in getattr(env_cls, "__orig_bases__", ()):  # a class's declared bases: not every class has generics
        for arg in typing.get_args(base):
            if isinstance(arg, type) and issubclass(arg, Action):
                return arg
    try:
        hints = typing.get_type_hints(env_cls.step)
    except (NameError, TypeError) as e:  # an annotation that names what its module does not import
        raise ValueError(f"{env_cls.__name__}.step's annotations do not resolve ({e}): pass env_args "
                         "action=module:ActionClass") from None
    annotated = [h for k, h in hints.items() if k != "return" and isinstance(h, type) and issubclass(h, Action)]
    if len(annotated) == 1:
        return annotated[0]
    raise ValueError(f"{env_cls.__name__} declares no Action type (neither Environment[Action, Observation, State] "
                     "nor an Action annotation on step's action): pass env_args action=module:ActionClass")


def _reset_kwargs(env: Any, seed: int) -> dict[str, Any]:
    """`seed` for an env whose `reset` takes it. OpenEnv's server passes reset only the arguments its signature
    names (`http_server._get_valid_kwargs`), and `openenv init`'s template has `reset(self)`: an env runs in this
    process as it runs under its own server."""
    params = inspect.signature(env.reset).parameters
    takes = "seed" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return {"seed": seed} if takes else {}


class OpenEnvEnv(TextGameEnv):
    family = "openenv"
    harnesses = ("json", "text")

    def __init__(self, env_id: str, *, action: str | None = None, timeout_s: float = 60.0,
                 session_wait_s: float = SESSION_WAIT_S, **kwargs: Any):
        require("openenv.core", "openenv", "openenv-core")
        own = {k: kwargs.pop(k) for k in ("harness", "max_turns", "system_prompt", "tasks", "max_invalid_actions")
               if k in kwargs}
        super().__init__(env_id, **own)
        target = None if env_id.startswith(("http://", "https://")) else import_target(env_id)
        url = env_id if target is None else _served_app(env_id, target) if _is_app(target) else None
        self.remote = url is not None
        if self.remote and kwargs:
            raise ValueError(f"openenv:{env_id} is a server: its env is built by the server, not from env_args "
                             f"{', '.join(sorted(kwargs))}")
        self.kwargs = kwargs
        if self.remote:
            from openenv.core.generic_client import GenericEnvClient

            schema = self._schema(url, timeout_s)
            self.client = GenericEnvClient(base_url=url, message_timeout_s=timeout_s).sync()
            self.gate, self.session_wait_s, self.in_session = SessionGate.of(url), session_wait_s, False
            self.abandoned = threading.Event()  # set by close(): a reset still waiting for a session gives up
            self.mcp = "tool_name" in (schema.get("properties") or {})  # its action is MCP's CallToolAction
            if self.mcp:
                listed = dict(self._in_session(lambda: self.client.step({"type": "list_tools"})).observation
                              or {}).get("tools") or []
                self._end_session()
                self.tools = self._mcp_tools(listed, lambda name, args: self.client.step(
                    {"type": "call_tool", "tool_name": name, "arguments": args}))
            else:
                tool = action_tool(schema, lambda **args: self.client.step(args))
                self.tools = {tool.name: tool}
        else:
            from openenv.core.env_server.mcp_environment import MCPEnvironment
            from openenv.core.env_server.mcp_types import CallToolAction, ListToolsAction

            env_cls = target
            self.env = env_cls(**kwargs)
            self.mcp = isinstance(self.env, MCPEnvironment)
            if self.mcp:
                listed = [t.model_dump(mode="json") for t in self.env.step(ListToolsAction()).tools]
                self.tools = self._mcp_tools(listed, lambda name, args: self.env.step(
                    CallToolAction(tool_name=name, arguments=args)))
            else:
                model = _action_model(env_cls, action)
                tool = action_tool(model.model_json_schema(), lambda **args: self.env.step(model(**args)))
                self.tools = {tool.name: tool}
        self.harness = Harness(self.format, budget=self.max_turns)
        self.system_prompt = self.system_prompt or self.harness.system_message(
            MCP_INSTRUCTIONS if self.mcp else INSTRUCTIONS, self.tools)

    def _mcp_tools(self, listed: list[dict[str, Any]], call: Any) -> dict[str, Tool]:
        if not listed:
            raise EnvFailure(f"openenv:{self.env_id} is an MCP env that lists no tools")
        return {t["name"]: mcp_tool(t, call) for t in listed}

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
        return [t.schema() for t in self.tools.values()]

    def begin(self, task: Task, seed: int) -> Move:
        if self.remote:
            return self._move(self._in_session(lambda: self.client.reset(seed=seed)))
        return self._move(self.env.reset(**_reset_kwargs(self.env, seed)))

    def _in_session(self, call: Any) -> Any:
        """`call()` in this env's server session, opened first (waiting for a free one) if none is held."""
        if self.in_session:
            return call()

        def connect() -> Any:
            try:
                return call()
            except Exception:
                with contextlib.suppress(Exception):  # the next try opens a new WebSocket
                    self.client.disconnect()
                raise

        try:
            out = open_session(self.gate, connect, _refused_session, time.monotonic() + self.session_wait_s,
                               self.abandoned)
        except SessionsBusy as e:
            raise EnvFailure(f"openenv:{self.env_id}: {e}") from None
        self.in_session = True
        return out

    def _end_session(self) -> None:
        if self.in_session:
            self.in_session = False
            with contextlib.suppress(Exception):  # best effort, as OpenEnv's own disconnect
                self.client.disconnect()
            self.gate.release()

    def finish(self) -> None:
        if self.remote:
            self._end_session()

    def advance(self, action: str) -> Move:
        parsed = self.harness.parser.parse(action, self.tools)
        call = parsed.calls[0] if parsed.calls else None
        error = parsed.error or (None if call is None or call.name in self.tools else
                                 f"unknown tool {call.name!r}; the tools are {', '.join(map(repr, self.tools))}")
        if error is None:
            tool = self.tools[call.name]
            args, error = tool.check_arguments(call.arguments)
        if error is not None:
            return Move(self.harness.parser.wrap(error), error=error, refused=True)
        try:
            out = tool.fn(**args)
        except (ValueError, TypeError) as e:  # the action model refused the arguments (pydantic's ValidationError)
            message = f"the action was refused: {str(e).splitlines()[0]}"
            return Move(self.harness.parser.wrap(message), error=message, tool_call=call.to_dict(), refused=True)
        move = self._move(out)
        move.tool_call = call.to_dict()
        move.observation = self.harness.clip(move.observation)
        return move

    def _move(self, result: Any) -> Move:
        """An OpenEnv observation (in process) or `StepResult` (client) as a Move."""
        if self.remote:
            fields, reward, done = dict(result.observation or {}), result.reward, result.done
        else:
            fields, reward, done = result.model_dump(mode="json"), result.reward, result.done
        text = mcp_text(fields) if self.mcp and "tool_name" in fields else observation_text(fields)
        return Move(text, float(reward or 0.0), bool(done))

    def close(self) -> None:
        if self.remote:
            self.abandoned.set()
            self._end_session()
            self.client.close()
        else:
            self.env.close()


def _is_app(target: Any) -> bool:
    """A server module's app (`create_app(Env, Action, Observation)`, as `openenv init`'s `server/app.py`)."""
    from starlette.applications import Starlette

    return isinstance(target, Starlette)


_apps: dict[str, str] = {}  # a server module's app → the URL it is served at in this process
_servers = contextlib.ExitStack()  # holds them (a dropped context would stop its server); daemon threads
_apps_lock = threading.Lock()


def _served_app(target_id: str, app: Any) -> str:
    """`app` served on a loopback port for as long as this process lives (one server per app, however many envs
    use it): the env runs exactly as its server module deploys it, its session limit included."""
    with _apps_lock:
        if target_id not in _apps:
            _apps[target_id] = _servers.enter_context(in_thread(app))
        return _apps[target_id]


def _refused_session(error: Exception) -> bool:
    """An OpenEnv server at capacity: it answers the new WebSocket with CAPACITY_REACHED and closes it, which the
    client reports as that error, or as the connection closed normally (1000) under its first message."""
    from websockets.exceptions import ConnectionClosedOK

    return isinstance(error, ConnectionClosedOK) or "CAPACITY_REACHED" in str(error)


def make(env_id: str, **env_args: Any) -> OpenEnvEnv:
    return OpenEnvEnv(env_id, **env_args)
