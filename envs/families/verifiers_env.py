"""`verifiers:<env id>`: a verifiers (0.4.0, the v1 API) environment in sleuth's loop. The id is what verifiers'
own loader takes (`vf-eval <id>`): a module that exports one `vf.Taskset`, optionally its `vf.Harness`, and
optionally its own `vf.Env` (e.g. a `SingleAgentEnv` whose `run()` holds an interaction open and scripts the user's
follow-up turns); `--env.id`'s counterpart is `config: {id: ...}`.

verifiers owns its episode, and sleuth runs it as vf-eval does: the env (`load_environment`: the package's own, else
`SingleAgentEnv`) serves its resources once per sleuth env (shared tool servers, the interception server) and each
episode is its `run_episode` (`setup`, its own `run`, `finalize`); its harness (the env's own, else verifiers'
default, `bash`) runs the tools (MCP toolsets) and asks a model for every assistant turn. sleuth takes the model's
seat: each model request verifiers makes is parked and becomes an observation (the messages added since the
policy's last reply — tool results, user turns, an env's scripted follow-ups), the policy's sampled reply goes back
as the assistant message (its tool calls read in sleuth's tool-call format, `json` or `text`, against the tools the
request offered), and when the episode ends, the task's rubric (and the env's `finalize`) have scored the trace
(`trace.reward`, the weighted sum of its rewards). The trajectory holds the policy's own sampled ids, as for any
env, so what cannot be one conversation is refused or fails: an env of several agent seats (a modeled user, a judge
agent) is refused when made; a harness that rewrites the conversation between calls (compaction), or an env that
runs its seat twice in one episode, fails the episode.

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
SYSTEM_ROLES = ("system", "developer")


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


def _legacy_form(env_id: str) -> bool:
    """Whether `env_id`'s module is a verifiers < 0.4 env (a `load_environment()` returning e.g. a
    `vf.MultiTurnEnv`): read from its source, as its import fails under verifiers 0.4 (no `vf.Environment`)."""
    spec = importlib.util.find_spec(env_id.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower())
    origin = Path(spec.origin) if spec and spec.origin else None
    return bool(origin and origin.is_file() and "def load_environment(" in origin.read_text(errors="replace"))


def env_config(env_id: str, config: dict[str, Any]) -> Any:
    """verifiers' env config for `env_id`, as `vf-eval <env_id>` resolves it (the package's own `Env` subclass, else
    `SingleAgentEnv`), with what sleuth runs by default where `config` names nothing: the `subprocess` runtime
    (verifiers' default is a hosted sandbox) and one interception server. An env of several agent seats is refused:
    sleuth's policy plays one seat, and one trajectory is one conversation."""
    import verifiers.v1 as vf
    from verifiers.v1.configs.agent import agent_config_fields

    given = {**config, "taskset": {"id": env_id, **config.get("taskset", {})}}
    given.setdefault("interception", {"type": "server"})
    try:
        seats = agent_config_fields(vf.resolve_env_config(given))
    except Exception:
        if _legacy_form(env_id):
            raise ValueError(f"verifiers:{env_id} is a verifiers < 0.4 environment (`load_environment()` returning a "
                             "vf.Environment such as vf.MultiTurnEnv), which verifiers 0.4 (v1), the release sleuth "
                             "runs, does not load; port it to a vf.Taskset (and a vf.Env for its own turns)") from None
        raise
    if len(seats) != 1:
        raise ValueError(f"verifiers:{env_id}'s env seats {len(seats)} agents ({', '.join(seats)}): sleuth's policy "
                         "plays one seat and a trajectory is one conversation, so a multi-agent vf.Env (a modeled "
                         "user, a judge agent) is not run; a vf.Env of one seat whose run() scripts the "
                         "user's turns (agents.<seat>.interaction) is")
    (seat,) = seats
    given[seat] = {"runtime": {"type": "subprocess"}, **given.get(seat, {})}  # merged onto the seat's own defaults
    return vf.resolve_env_config(given)


class VerifiersEnv(TextGameEnv):
    family = "verifiers"
    harnesses = ("json", "text")

    def __init__(self, env_id: str, *, config: dict[str, Any] | None = None, timeout_s: float = 600.0,
                 **kwargs: Any):
        vf = require("verifiers.v1", "verifiers", "verifiers")
        from verifiers.v1.interception import InterceptionServer

        own = {k: kwargs.pop(k) for k in ("harness", "max_turns", "system_prompt", "tasks") if k in kwargs}
        if kwargs:
            raise ValueError(f"verifiers:{env_id} takes config (verifiers' own env config), timeout_s, harness, "
                             f"max_turns and system_prompt; not {', '.join(sorted(kwargs))}")
        super().__init__(env_id, **own)
        self.config, self.timeout_s = dict(config or {}), timeout_s
        self.vf_env = vf.load_environment(env_config(env_id, self.config))  # as vf-eval loads it
        self.rows = list(self.vf_env.taskset)
        if not self.rows:
            raise ValueError(f"verifiers:{env_id} has an empty taskset")
        _offline_chat_programs()
        self.client = vf.EvalClientConfig(base_url="http://sleuth.invalid/v1", api_key_var="SLEUTH_NO_KEY")
        self.ctx = vf.ModelContext(model=MODEL, client=self.client)
        self.harness = Harness(self.format)
        self.tools: dict[str, Tool] = {}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=f"verifiers:{env_id}", daemon=True)
        self.thread.start()
        self.stack = contextlib.AsyncExitStack()
        # the env's serving resources (its shared tool servers, the interception server), held for this env's
        # episodes as vf-eval holds them for its run
        self._run(self.stack.enter_async_context(self.vf_env.serving()))
        self.requests: asyncio.Queue = self._run(self._queue())
        server = self.vf_env._interception  # set by serving(); verifiers 0.4.0 exposes it no other way
        if not isinstance(server, InterceptionServer):
            raise ValueError(f"verifiers:{env_id}: sleuth takes the model's seat through one interception server "
                             f"(config interception.type 'server'), not {type(server).__name__}")
        server.clients[self.client.model_dump_json()] = _ParkingClient(self.requests)
        self.rollout: asyncio.Future | None = None
        self.pending: asyncio.Future | None = None
        self.session: str | None = None

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
        self.seen, self.said, self.system_text, self.tools, self.trace, self.session = 0, [], "", {}, None, None
        # one episode as vf-eval runs it: the env's setup(), run() (its own turns) and finalize(), then the rubric
        self.rollout = asyncio.run_coroutine_threadsafe(self.vf_env.run_episode(self.rows[seed], self.ctx), self.loop)
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
            episode = self.rollout.result()
            if not episode.ok or len(episode.traces) != 1:
                raise EnvFailure(f"verifiers:{self.env_id} failed its episode: {self._why()}")
            self.trace = episode.traces[0]
            return Move("", reward=float(self.trace.reward or 0.0), terminated=True)
        body, self.pending, session = got
        if self.session is not None and session != self.session:
            raise EnvFailure(f"verifiers:{self.env_id}'s env ran its seat a second time in one episode (a new rollout, "
                             "e.g. a retry or another attempt): a sleuth trajectory is one conversation")
        self.session = session
        return Move(self._observation(body["messages"], body))

    async def _park_or_end(self) -> tuple[dict[str, Any], asyncio.Future, str | None] | None:
        ended = asyncio.wrap_future(self.rollout)
        asked = asyncio.ensure_future(self.requests.get())
        done, _ = await asyncio.wait({ended, asked}, return_when=asyncio.FIRST_COMPLETED)
        if asked in done:
            return asked.result()
        asked.cancel()
        return None

    def _observation(self, messages: list[dict[str, Any]], body: dict[str, Any]) -> str:
        """The messages since the policy's last reply; on the first request, the system message joins the
        harness's tool-call instructions (`system_prompt` of this episode). A request must extend the conversation
        the policy has seen: the same system text (a harness that resumes a conversation may repeat it) and the
        same messages before the policy's last reply."""
        system = "\n\n".join(dict.fromkeys(message_text(m) for m in messages if m.get("role") in SYSTEM_ROLES))
        chat = [m for m in messages if m.get("role") not in SYSTEM_ROLES]
        said = [(m.get("role"), "" if m.get("role") == "assistant" else message_text(m)) for m in chat]
        if self.seen == 0:
            self.tools, self.system_text = request_tools(body), system
            self.system_prompt = (self.harness.system_message(system, self.tools) if self.tools else system) or None
            new = chat
        else:
            if (system != self.system_text or len(chat) <= self.seen or said[:self.seen] != self.said
                    or chat[self.seen].get("role") != "assistant"):
                raise EnvFailure(f"verifiers:{self.env_id}'s harness rewrote the conversation (e.g. compacted it): a "
                                 "sleuth trajectory is the policy's own tokens, turn after turn, and cannot follow a "
                                 "history that changes")
            new = chat[self.seen + 1:]  # after the policy's own reply, which it has in its history already
        self.seen, self.said = len(chat), said
        parts = [self.harness.parser.wrap(message_text(m)) if m.get("role") == "tool" else message_text(m)
                 for m in new]
        return "\n\n".join(p for p in parts if p)

    def _why(self) -> str:
        episode = self.rollout.result() if self.rollout is not None and self.rollout.done() else None
        if episode is None:
            return "no episode"
        said = [f"stop {t.stop_condition!r}: " + ("; ".join(str(e)[:300] for e in t.errors) or "no error recorded")
                for t in episode.traces]
        said += [f"{e.type}: {e.message[:300]}" for e in episode.errors]
        if len(episode.traces) > 1:
            said.append(f"{len(episode.traces)} rollouts of its seat in one episode, where sleuth follows one")
        return "; ".join(said) or "no rollout and no error recorded"

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

    async def _ask(self, body: dict[str, Any], session_id: str | None) -> dict[str, Any]:
        """Park `body` with the rollout it came from (`session_id`: verifiers passes the trace id)."""
        answer: asyncio.Future = asyncio.get_running_loop().create_future()
        await self.requests.put((body, answer, session_id))
        message = await answer
        return {"id": f"sleuth-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", MODEL),
                "choices": [{"index": 0, "message": {"role": "assistant", **message},
                             "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}

    async def get_response(self, dialect, body, sampling, session_id=None, turn=None, headers=None):
        raw = await self._ask(body, session_id)
        response = dialect.parse_response(dialect.validate_response(raw))
        response.raw = raw
        return response

    async def relay(self, dialect, body, session_id=None, headers=None):
        from verifiers.v1.clients.client import RelayReply

        raw = await self._ask(body, session_id)

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
