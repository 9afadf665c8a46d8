"""`Gateway`: chat completions over a sleuth policy for agents that speak the OpenAI API, each session's calls
recorded as token-exact `Trajectory`s — the same record sleuth's own agent loop makes.

A call whose messages extend the session's previous call (its messages, then the assistant message the
gateway sent, then tool or user messages) continues that call's token ids: the assistant turn is the ids the
policy sampled, never re-tokenised from the text the agent sent back, and only the new messages are
rendered (`ChatRenderer.observation_ids`, loss mask 0). A call that does not extend it (the agent dropped or
summarised old messages, changed the tools, or wrote an assistant message itself) starts a new segment: each
segment is a trajectory of its own, and `splits` counts them. With `n` > 1 the chain continues with the
choice the next call carries; the last call's first choice ends a segment, and the choices no call carried
are counted (`unused_choices`), not trained."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from sleuth.agents.chat import ChatRenderer
from sleuth.agents.gateway.batching import Coalescer
from sleuth.agents.gateway.render import ChatFormat, MessageError, Reply, normalise
from sleuth.agents.policies.base import Generation, Policy, Request, SamplingParams
from sleuth.agents.policies.requests import RequestQueue, WeightsGate
from sleuth.agents.trajectory import Trajectory, Turn
from sleuth.core.errors import BadInput
from sleuth.tasks.base import Task

ENV_ID = "gateway"
# How long a call to a model in this process waits for other sessions' calls to share its batch (bench/gateway.py:
# without it the batches of 4 concurrent agents halved and episodes/min fell to 0.71-0.76x the agent loop's).
BATCH_WINDOW_S = 0.03


class ContextOverflow(BadInput):
    """The prompt and `max_tokens` do not fit the policy's context: the call is refused, never sent."""


@dataclass
class Choice:
    message: dict[str, Any]  # the OpenAI assistant message sent to the agent
    finish_reason: str  # "stop", "length" or "tool_calls"
    ids: list[int]  # the sampled ids (what the trajectory records)
    logprobs: list[float]  # one sampling logprob per id


@dataclass
class Completion:
    choices: list[Choice]
    prompt_tokens: int
    policy_version: int


@dataclass
class GatewayEpisode:
    """A closed session: its segments (token-exact trajectories, in order) and what happened to its calls."""

    session: str
    task: Task | None
    segments: list[Trajectory]
    calls: int
    splits: int  # segments started by a call that did not extend the previous one
    unused_choices: int
    failed_calls: int = 0  # calls the engine could not answer (the agent got a 503)
    error: str | None = None  # the last such failure: an episode with one is no answer, whatever the agent said


@dataclass
class _Pending:
    norm: dict[str, Any]  # the normalised assistant message the agent got
    generation: Generation
    version: int
    reply: Reply


@dataclass
class _Chain:
    """The segment being recorded: the last call's prompt (messages and ids) and its choices."""

    tools_key: str
    messages: list[dict[str, Any]]
    context: list[int]
    traj: Trajectory
    pending: list[_Pending] = field(default_factory=list)


@dataclass
class _Session:
    task: Task
    index: int  # seeds its samples, whatever the batching
    lock: threading.Lock = field(default_factory=threading.Lock)
    chain: _Chain | None = None
    segments: list[Trajectory] = field(default_factory=list)
    calls: int = 0
    splits: int = 0
    unused_choices: int = 0
    failed_calls: int = 0
    error: str | None = None


class _OneCallAtATime:
    """A policy whose `generate` runs one call at a time: calls with different sampling go through their own
    queues, and a model in this process (one call slot) must still see them one after another."""

    def __init__(self, policy: Policy):
        self.inner, self._lock = policy, threading.Lock()
        self.name, self.tokenizer, self.parallel_calls = policy.name, policy.tokenizer, policy.parallel_calls

    @property
    def version(self) -> int:
        return self.inner.version

    @property
    def max_context(self) -> int | None:
        return self.inner.max_context

    def generate(self, requests: list[Request], sampling: SamplingParams) -> list[Generation]:
        with self._lock:
            return self.inner.generate(requests, sampling)


class Gateway:
    """`sampling`: the defaults of a call that names none. `fixed_sampling` (training): every call samples
    with them whatever it asks (at most their `max_tokens`), so the recorded logprobs are those of the
    temperature the trainer divides its logits by."""

    def __init__(self, policy: Policy, sampling: SamplingParams | None = None, gate: WeightsGate | None = None,
                 fixed_sampling: bool = False):
        self.policy = policy if policy.parallel_calls > 1 else _OneCallAtATime(policy)
        self.defaults = sampling or SamplingParams(max_tokens=256, temperature=1.0)
        self.fixed_sampling = fixed_sampling
        self.gate = gate
        self.renderer = ChatRenderer(policy.tokenizer)
        self.format = ChatFormat(policy.tokenizer)
        self.model_name = policy.name
        self._sessions: dict[str, _Session] = {}
        self._queues: dict[tuple, RequestQueue] = {}
        self._coalescers: dict[tuple, Coalescer] = {}
        self._lock = threading.Lock()
        self._opened = 0
        self._cancelled: dict[str, str] = {}  # sessions given up on, and why: a late call is refused, not recorded
        # Characters one token can stand for at most (its longest vocabulary string: a byte-level token's string
        # has a character per byte): messages with more characters than the context times this cannot fit, and
        # are refused before tokenising them (30 MB of text takes ~30 s of CPU to tokenise).
        self._max_chars = (None if policy.max_context is None
                           else policy.max_context * max(len(t) for t in policy.tokenizer.get_vocab()))

    # -- sessions ---------------------------------------------------------------------------------------
    def begin(self, session: str, task: Task | None = None) -> None:
        """Open `session` (a first call opens it too); `task` names its trajectories and reaches the policy."""
        with self._lock:
            if session in self._sessions:
                raise ValueError(f"session {session!r} is already open")
            self._sessions[session] = _Session(task or Task(id=session, question=""), self._opened)
            self._opened += 1

    def end(self, session: str) -> GatewayEpisode:
        """Close `session` and return what it recorded (nothing if it made no call)."""
        with self._lock:
            s = self._sessions.pop(session, None)
        if s is None:
            return GatewayEpisode(session, None, [], 0, 0, 0)
        with s.lock:
            self._close_chain(s)
            return GatewayEpisode(session, s.task, s.segments, s.calls, s.splits, s.unused_choices, s.failed_calls,
                                  s.error)

    def cancel(self, session: str, why: str) -> None:
        """End `session` and drop what it recorded (its episode was given up on: `why`); its later calls are
        refused with `why`, so an agent left running past its deadline records and generates nothing more."""
        self.end(session)
        with self._lock:
            self._cancelled[session] = why

    def _session(self, session: str) -> _Session:
        with self._lock:
            if session in self._cancelled:
                raise MessageError(f"session {session!r} has ended: {self._cancelled[session]}")
            if session not in self._sessions:
                self._sessions[session] = _Session(Task(id=session, question=""), self._opened)
                self._opened += 1
            return self._sessions[session]

    # -- calls ------------------------------------------------------------------------------------------
    def complete(self, session: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                 sampling: SamplingParams | None = None, n: int = 1, stop: list[str] | None = None) -> Completion:
        """One chat completion in `session` (blocking; sessions run in parallel, one session's calls in order).
        Raises `MessageError` for unreadable messages, `ContextOverflow` when the prompt cannot fit."""
        norm = [normalise(m) for m in messages]
        if not norm:
            raise MessageError("messages must not be empty")
        if n < 1:
            raise MessageError(f"n must be at least 1, got {n}")
        if self.fixed_sampling or sampling is None:
            asked = sampling.max_tokens if sampling is not None else self.defaults.max_tokens
            sampling = replace(self.defaults, max_tokens=min(asked, self.defaults.max_tokens))
        self._check_length(norm)
        tools_key = json.dumps(tools, sort_keys=True) if tools else ""
        s = self._session(session)
        with s.lock:
            extends = self._extension(s.chain, norm, tools_key)
            if extends is not None:
                chosen, observation = extends
                prompt = s.chain.context + chosen.generation.ids + observation
            else:
                prompt = self.renderer.encode(self.policy.tokenizer.apply_chat_template(
                    self.format.template_messages(norm, tools), tools=self.format.template_tools(tools),
                    tokenize=False, add_generation_prompt=True))
            limit = self.policy.max_context
            if limit is not None and len(prompt) + sampling.max_tokens > limit:
                raise ContextOverflow(f"the prompt is {len(prompt)} tokens; with max_tokens {sampling.max_tokens} "
                                      f"it does not fit the model's context of {limit}")
            turn = len(s.chain.traj.turns) + 1 if extends is not None else 0
            try:
                generations, version = self._generate(s, prompt, norm, sampling, n, turn)
            except Exception as e:  # the session is left as it was: the agent may retry the call
                s.failed_calls += 1
                s.error = f"engine failed: {type(e).__name__}: {e}"
                raise
            if extends is not None:
                self._continue(s.chain, chosen, observation, norm, prompt)
            else:
                if s.chain is not None:
                    s.splits += 1
                self._close_chain(s)
                traj = Trajectory(s.task.id, ENV_ID, prompt_ids=prompt, group=s.task.id, meta={"session": session})
                s.chain = _Chain(tools_key, norm, prompt, traj)
            s.calls += 1
            choices = [_cut_at_stop(g, stop or [], self._decode) for g in generations]
            s.chain.pending = []
            out = []
            for g in choices:
                reply = self.format.reply(g.text, tools)
                s.chain.pending.append(_Pending(normalise(reply.message), g, version, reply))
                finish = "tool_calls" if reply.tool_call else ("length" if g.finish_reason == "length" else "stop")
                out.append(Choice(reply.message, finish, g.ids, g.logprobs))
            return Completion(out, len(prompt), version)

    def _check_length(self, norm: list[dict[str, Any]]) -> None:
        """Refuse messages that cannot fit the context by their characters alone, before tokenising them."""
        if self._max_chars is None:
            return
        chars = sum(len(m["content"]) + sum(len(json.dumps(a)) for _, _, a in m.get("tool_calls", [])) for m in norm)
        if chars > self._max_chars:
            raise ContextOverflow(f"the messages are {chars} characters, more than a context of "
                                  f"{self.policy.max_context} tokens can hold: refused without tokenising them")

    def _extension(self, chain: _Chain | None, norm: list[dict[str, Any]], tools_key: str
                   ) -> tuple[_Pending, list[int]] | None:
        """(the choice the call carries, the ids of its new messages) when `norm` extends `chain`, else None."""
        if chain is None or tools_key != chain.tools_key:
            return None
        k = len(chain.messages)
        if len(norm) <= k + 1 or norm[:k] != chain.messages:
            return None
        chosen = next((p for p in chain.pending if p.norm == norm[k]), None)
        delta = norm[k + 1:]
        if chosen is None or any(m["role"] == "assistant" for m in delta):
            return None
        return chosen, self.renderer.observation_ids(self.format.template_messages(delta, None), chosen.generation.ids)

    def _continue(self, chain: _Chain, chosen: _Pending, observation: list[int], norm: list[dict[str, Any]],
                  prompt: list[int]) -> None:
        turn = _turn(chosen)
        turn.observation_ids = observation
        turn.observation = "\n".join(m["content"] for m in norm[len(chain.messages) + 1:])
        chain.traj.turns.append(turn)
        chain.messages, chain.context = norm, prompt

    def _close_chain(self, s: _Session) -> None:
        """End the session's segment: the last call's first choice is its final turn."""
        chain, s.chain = s.chain, None
        if chain is None:
            return
        if chain.pending:
            chain.traj.turns.append(_turn(chain.pending[0]))
            s.unused_choices += len(chain.pending) - 1
        chain.traj.terminated = True
        chain.traj.stop_reason = "final"
        chain.traj.segment = len(s.segments)
        s.segments.append(chain.traj)

    def _generate(self, s: _Session, prompt: list[int], norm: list[dict[str, Any]], sampling: SamplingParams,
                  n: int, turn: int) -> tuple[list[Generation], int]:
        key = (sampling.max_tokens, sampling.temperature, sampling.top_p, sampling.seed)
        with self._lock:
            queue = self._queues.get(key)
            if queue is None:
                queue = self._queues[key] = RequestQueue(self.policy, sampling, self.gate)
                if self.policy.parallel_calls == 1:  # a server batches what it gets; a model here needs a batch
                    self._coalescers[key] = Coalescer(queue, BATCH_WINDOW_S, self._open_sessions)
        requests = [Request(prompt, norm, s.task, turn, None, s.index * 64 + j) for j in range(n)]
        sender = self._coalescers.get(key, queue)
        sampled = [f.result() for f in sender.submit(requests)]
        return [x.generation for x in sampled], sampled[0].version

    def _open_sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

    def _decode(self, ids: list[int]) -> str:
        return self.policy.tokenizer.decode(ids, skip_special_tokens=True)

    def close(self) -> None:
        for queue in self._queues.values():
            queue.close()


def _turn(p: _Pending) -> Turn:
    g = p.generation
    return Turn(g.ids, g.logprobs, g.text, tool_call=p.reply.tool_call, error=p.reply.error,
                policy_version=p.version, finish_reason=g.finish_reason)


def _cut_at_stop(g: Generation, stop: list[str], decode: Callable[[list[int]], str]) -> Generation:
    """`g` up to the first stop string: the ids through the token that completes it (the trajectory keeps
    exactly what was sampled), the text before it (OpenAI leaves the stop string out)."""
    found = [(g.text.find(s), s) for s in stop if s and s in g.text]
    if not found:
        return g
    at, _ = min(found)
    for k in range(1, len(g.ids) + 1):
        if len(decode(g.ids[:k])) > at and any(s in decode(g.ids[:k]) for s in stop if s):
            return replace(g, ids=g.ids[:k], logprobs=g.logprobs[:k], text=g.text[:at], finish_reason="stop")
    return replace(g, text=g.text[:at], finish_reason="stop")
