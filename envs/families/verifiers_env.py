"""`verifiers:<env id>`: a verifiers (0.4.0, the v1 API) environment in sleuth's loop. The id is what verifiers'
own loader takes (`vf-eval <id>`): a module that exports one `vf.Taskset`, and optionally its `vf.Harness`.

verifiers owns its episode: its harness (the env's own, else verifiers' default, `bash`) runs the multi-turn
logic and its tools (MCP toolsets), and asks a model for every assistant turn. sleuth takes the model's seat: each
model request verifiers makes is parked and becomes an observation (the messages the harness added since the
policy's last reply — tool results, user turns), the policy's sampled reply goes back as the assistant message
(its tool calls read in sleuth's tool-call format, `json` or `text`, against the tools the request offered), and
when the harness ends, the task's rubric scores the trace (`trace.reward`, the weighted sum of its `@vf.reward`s).
The trajectory holds the policy's own sampled ids, as for any env; a harness that rewrites the conversation
between calls (compaction) fails the episode, since the trajectory cannot follow a history that changes.

Tasks are rows of the env's taskset: `--tasks seeds:A-B` plays rows A..B (a seed past the last row is refused),
and a training config names its rows (`tasks: seeds:...`), disjoint from the rows it is evaluated on.

verifiers pins `openai<3` and `mcp==2.0.0`, which sleuth's main venv outgrows, so where the PyPI `verifiers` does
not import, `make` starts `sleuth serve env` in verifiers' own venv (`make verifiers`; $SLEUTH_VERIFIERS_PYTHON) and
returns a `RemoteEnv` on it (`verifiers_server.py`). In that venv the env runs here, in process.

Offline: verifiers' `bash` and `null` harnesses run a bundled chat program that it would install with `uv` from
PyPI on first use; sleuth points that program at the venv's own interpreter, which holds its dependencies. A
harness whose program needs packages the venv lacks fails the episode (an env failure, never a score)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.util
import json
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from sleuth.envs.families.base import EnvFailure, Move, TextGameEnv, require
from sleuth.envs.harness import Harness
from sleuth.envs.tools import Tool
from sleuth.tasks.base import Task
from sleuth.verifiers.base import Verdict

MODEL = "sleuth-policy"  # the model name verifiers records; the policy answers whatever it is called


def pypi_verifiers_importable() -> bool:
    """Whether `import verifiers` here is the PyPI package (it has `v1`), not sleuth's own `verifiers/` folder,
    which shadows it when the repository root is on sys.path."""
    spec = importlib.util.find_spec("verifiers")
    return bool(spec and spec.submodule_search_locations and
                any((Path(p) / "v1").is_dir() for p in spec.submodule_search_locations))


def message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # OpenAI content parts: the text ones
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def request_tools(body: dict[str, Any]) -> dict[str, Tool]:
    """The OpenAI function tools a request offers, as sleuth tools (schemas only: verifiers runs them)."""
    tools = {}
    for spec in body.get("tools") or []:
        if (spec.get("function") or {}).get("name"):
            tools[spec["function"]["name"]] = Tool.run_elsewhere(spec)
    return tools


def _offline_chat_programs() -> None:
    """Register this interpreter for verifiers' bundled chat program (the `bash` and `null` harnesses), so its
    subprocess runtime runs it here instead of preparing it with `uv` from PyPI. Keyed as verifiers 0.4.0 keys
    prepared scripts (`SubprocessRuntime`: scripts_dir / sha256(source).py); the family's tests run both
    harnesses, so a release that moves this fails there."""
    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    data = CHAT_PROGRAM_SOURCE.encode()
    path = Path(SubprocessRuntime.scripts_dir) / f"{hashlib.sha256(data).hexdigest()}.py"
    if str(path) not in SubprocessRuntime._interpreters:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        SubprocessRuntime._interpreters[str(path)] = sys.executable


class VerifiersEnv(TextGameEnv):
    family = "verifiers"
    harnesses = ("json", "text")

    def __init__(self, env_id: str, *, config: dict[str, Any] | None = None, timeout_s: float = 600.0,
                 **kwargs: Any):
        vf = require("verifiers.v1", "verifiers", "verifiers")
        from verifiers.v1.interception import InterceptionServer
        from verifiers.v1.mcp import serve_shared
        from verifiers.v1.utils.loaders import default_harness_id, harness_config_type

        own = {k: kwargs.pop(k) for k in ("harness", "max_turns", "system_prompt", "tasks") if k in kwargs}
        if kwargs:
            raise ValueError(f"verifiers:{env_id} takes config (verifiers' own env config), timeout_s, harness, "
                             f"max_turns and system_prompt; not {', '.join(sorted(kwargs))}")
        super().__init__(env_id, **own)
        self.config, self.timeout_s = dict(config or {}), timeout_s
        given = {**self.config, "taskset": {"id": env_id, **self.config.get("taskset", {})}}
        agent = given.setdefault("agent", {})
        agent.setdefault("runtime", {"type": "subprocess"})  # verifiers' default is a hosted sandbox
        env_config = vf.resolve_env_config(given)
        taskset = vf.load_taskset(env_config.taskset)
        self.rows = list(taskset)
        if not self.rows:
            raise ValueError(f"verifiers:{env_id} has an empty taskset")
        harness = env_config.agent.harness
        if harness is None:
            harness_id = default_harness_id(env_id)
            harness = harness_config_type(harness_id)(id=harness_id)
        _offline_chat_programs()
        self.client = vf.EvalClientConfig(base_url="http://sleuth.invalid/v1", api_key_var="SLEUTH_NO_KEY")
        self.agent_config = env_config.agent.model_copy(update={"harness": harness, "model": MODEL,
                                                                "client": self.client})
        self.harness = Harness(self.format)
        self.tools: dict[str, Tool] = {}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=f"verifiers:{env_id}", daemon=True)
        self.thread.start()
        self.stack = contextlib.AsyncExitStack()
        self.server = self._run(self.stack.enter_async_context(InterceptionServer()))
        self.requests: asyncio.Queue = self._run(self._queue())
        self.server.clients[self.client.model_dump_json()] = _ParkingClient(self.requests)
        # the taskset's shared tool servers, started once for this env's episodes, as verifiers' Env starts them
        shared = taskset.toolsets(taskset.config)
        self.shared_tools = self._run(self.stack.enter_async_context(serve_shared(shared))) if shared else {}
        self.vf_agent = vf.Agent(self.agent_config, interception=self.server)
        self.rollout: asyncio.Future | None = None
        self.pending: asyncio.Future | None = None

    async def _queue(self) -> asyncio.Queue:
        return asyncio.Queue()  # made on the env's loop, where it is used

    def _run(self, coro: Any, timeout: float | None = None) -> Any:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def env_args(self) -> dict[str, Any]:
        return {"config": self.config, "timeout_s": self.timeout_s}

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self.tools.values()]

    # -- the episode ----------------------------------------------------------------------------------
    def begin(self, task: Task, seed: int) -> Move:
        if not 0 <= seed < len(self.rows):
            raise ValueError(f"seed {seed} is not a row of verifiers:{self.env_id}, which has {len(self.rows)} "
                             f"(seeds:0-{len(self.rows) - 1})")
        self._cancel()
        self.seen, self.tools, self.trace = 0, {}, None
        self.rollout = asyncio.run_coroutine_threadsafe(self.vf_agent.run(self.rows[seed], tools=self.shared_tools),
                                                        self.loop)
        move = self._next()
        if move.terminated:
            raise EnvFailure(f"verifiers:{self.env_id} ended its episode before asking the model: "
                             f"{self._why()}")
        return move

    def advance(self, action: str) -> Move:
        parsed = self.harness.parser.parse(action, self.tools) if self.tools else None
        if parsed is not None and parsed.calls:
            message = {"content": None, "tool_calls": [
                {"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
                for c in parsed.calls]}
        else:  # no call: the reply is the answer, as verifiers' harnesses read a turn without tool calls
            message = {"content": action}
        pending, self.pending = self.pending, None
        self.loop.call_soon_threadsafe(pending.set_result, message)
        return self._next()

    def _next(self) -> Move:
        """Wait for the harness's next model request (an observation) or the end of its episode (the score)."""
        try:
            got = self._run(self._park_or_end(), self.timeout_s)
        except TimeoutError:
            raise EnvFailure(f"verifiers:{self.env_id} neither asked the model nor ended within {self.timeout_s:g} s "
                             "(env_args timeout_s)") from None
        if got is None:  # the episode ended
            self.trace = self.rollout.result()
            if not self.trace.ok:
                raise EnvFailure(f"verifiers:{self.env_id} failed its episode: {self._why()}")
            return Move("", reward=float(self.trace.reward or 0.0), terminated=True)
        body, self.pending = got
        return Move(self._observation(body["messages"], body))

    async def _park_or_end(self) -> tuple[dict[str, Any], asyncio.Future] | None:
        ended = asyncio.wrap_future(self.rollout)
        asked = asyncio.ensure_future(self.requests.get())
        done, _ = await asyncio.wait({ended, asked}, return_when=asyncio.FIRST_COMPLETED)
        if asked in done:
            return asked.result()
        asked.cancel()
        return None

    def _observation(self, messages: list[dict[str, Any]], body: dict[str, Any]) -> str:
        """The messages since the policy's last reply; on the first request, the system message joins the
        harness's tool-call instructions (`system_prompt` of this episode)."""
        if self.seen == 0:
            self.tools = request_tools(body)
            system = "\n\n".join(message_text(m) for m in messages if m.get("role") in ("system", "developer"))
            if self.tools:
                system = self.harness.system_message(system, self.tools)
            self.system_prompt = system or None
            new = [m for m in messages if m.get("role") not in ("system", "developer")]
        else:
            if len(messages) <= self.seen or messages[self.seen].get("role") != "assistant":
                raise EnvFailure(f"verifiers:{self.env_id}'s harness rewrote the conversation (e.g. compacted it): a "
                                 "sleuth trajectory is the policy's own tokens, turn after turn, and cannot follow a "
                                 "history that changes")
            new = messages[self.seen + 1:]  # after the policy's own reply, which it has in its history already
        self.seen = len(messages)
        parts = [self.harness.parser.wrap(message_text(m)) if m.get("role") == "tool" else message_text(m)
                 for m in new]
        return "\n\n".join(p for p in parts if p)

    def _why(self) -> str:
        trace = self.rollout.result() if self.rollout is not None and self.rollout.done() else None
        if trace is None:
            return "no trace"
        errors = "; ".join(str(e)[:300] for e in trace.errors) or "no error recorded"
        return f"stop {trace.stop_condition!r}: {errors}"

    def verdict(self) -> Verdict:
        if self.trace is None:  # cut off by max_turns before the harness ended: no score
            return Verdict(0.0, {"stop": "max_turns", "turns": self.turn})
        scores = {f"reward/{k}": float(v.score) for k, v in self.trace.rewards.items() if v is not None}
        metrics = {f"metric/{k}": float(v) for k, v in (self.trace.metrics or {}).items()
                   if isinstance(v, (int, float))}
        return Verdict(float(self.trace.reward or 0.0), {"stop": str(self.trace.stop_condition), "turns": self.turn,
                                                         **scores, **metrics})

    def _cancel(self) -> None:
        """End an episode cut off before its harness ended, and drop any request it left parked."""
        if self.rollout is not None and not self.rollout.done():
            self.rollout.cancel()
        with contextlib.suppress(Exception):
            self._run(self._drain(), 5)
        self.rollout = self.pending = None

    async def _drain(self) -> None:
        await asyncio.sleep(0)  # the cancellation runs its cleanup
        while not self.requests.empty():
            self.requests.get_nowait()

    def close(self) -> None:
        if not self.thread.is_alive():
            return
        self._cancel()
        with contextlib.suppress(Exception):
            self._run(self.stack.aclose(), 30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class _ParkingClient:
    """verifiers' model client interface (`get_response`, `relay`, `close`) that answers no model: each request
    waits in `requests` with a future the env resolves with the policy's assistant message."""

    def __init__(self, requests: asyncio.Queue):
        self.requests = requests

    async def _ask(self, body: dict[str, Any]) -> dict[str, Any]:
        answer: asyncio.Future = asyncio.get_running_loop().create_future()
        await self.requests.put((body, answer))
        message = await answer
        return {"id": f"sleuth-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", MODEL),
                "choices": [{"index": 0, "message": {"role": "assistant", **message},
                             "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}

    async def get_response(self, dialect, body, sampling, session_id=None, turn=None, headers=None):
        raw = await self._ask(body)
        response = dialect.parse_response(dialect.validate_response(raw))
        response.raw = raw
        return response

    async def relay(self, dialect, body, session_id=None, headers=None):
        from verifiers.v1.clients.client import RelayReply

        raw = await self._ask(body)

        async def chunks():
            for event in dialect.stream_events(raw):
                yield event

        async def close() -> None:
            pass

        return RelayReply(content_type="text/event-stream", chunks=chunks(), close=close)

    async def close(self) -> None:
        pass


def make(env_id: str, **env_args: Any) -> Any:
    if pypi_verifiers_importable():
        return VerifiersEnv(env_id, **env_args)
    from sleuth.envs.families.verifiers_server import remote_env

    return remote_env(env_id, env_args)
