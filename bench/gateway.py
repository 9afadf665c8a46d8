"""Agents through the OpenAI-compatible gateway vs sleuth's own agent loop, and the gateway's own cost per call,
measured side by side in one run.

Run: `.venv/bin/python bench/gateway.py [episodes] [overhead] [vllm] [--quick]` (all three by default; part of
`make bench`). Prints a Markdown report and writes it to runs/bench/gateway.md.

- episodes: the same HotpotQA test tasks (`--tasks`), engine (transformers, the embedded SmolLM2 unless
  `--model`; greedy unless `--temperature`), concurrency, turn budget and max_tokens, run by
  (A) sleuth's own loop (`run_episodes` over `sleuth.make("DocRead-v0", harness="json")`) and
  (B) `DocReadAgent`, a DocRead-like agent written against the `openai` SDK alone (the same `read(doc)` /
  `answer(text)` tools, implemented by the agent over `task["payload"]["docs"]`), through the gateway served in
  this process (`run_agent_episodes`, verifier "qa"), as `sleuth eval --agent` runs it. A fresh engine per arm
  (no KV state carried over). Episodes/min and B/A, turns, generated and prompt tokens per episode, generated
  tokens/s, the engine's busy share, and whether both arms sent the same prompts.
- overhead: the gateway in front of a policy that answers at once (a test double: a fixed short tool call, as
  ids of the real SmolLM2 tokenizer), `--sessions` sessions at once (and one at a time), each `--calls` calls
  of a growing DocRead-like conversation, through the `openai` SDK and through raw httpx (the SDK's own client
  cost apart); then with the engine paced at `--engine-ms` a call, where the gateway's own part of a call is
  its latency less its time in the engine. The gateway in a process of its own (its CPU time per call measured
  there) and in this process; floors: `Gateway.complete` without HTTP, and the policy alone. Then where one
  unloaded call's time goes.
- vllm: arms A and B on a vLLM server (only where `.venv-vllm/bin/python` exists, or $SLEUTH_VLLM_PYTHON).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sleuth.cli_args import bounded

SECTIONS = ("episodes", "overhead", "vllm")
QUICK = {"tasks": 2, "concurrency": 2, "sessions": 8, "calls": 4}
DEFAULTS = {"tasks": 8, "concurrency": 8, "sessions": 64, "calls": 16}
INSTANT_MAX_TOKENS = 16

# -- arm B's agent: written against the openai SDK alone -------------------------------------------------------
# DocRead-v0's instructions and tool schemas, verbatim (checked against the env when the bench starts), so
# the gateway renders the same system prompt the env's json harness does.
INSTRUCTIONS = ("Answer the question. You see the titles of some documents; read the ones you need (each read "
                "shows you one document), then answer with a short phrase only: a name, a date, a number, or yes/no.")
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "read", "description": "Read one document and add its text to the conversation.",
        "parameters": {"type": "object", "properties": {"doc": {
            "type": ["integer", "string"], "description": "the document's number in the list (or its exact title)"}},
            "required": ["doc"]}}},
    {"type": "function", "function": {
        "name": "answer", "description": "Give the final answer (a short phrase) and end the episode.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string", "description": "the answer"}},
                       "required": ["text"]}}},
]
NO_CALL = 'no tool call found: reply with <tool_call>{"name": ..., "arguments": {...}}</tool_call>'
MAX_OBSERVATION = 4000


def _bare(title: str) -> str:
    return " ".join(title.strip().strip("[]\"'.").split()).lower()


def _clip(text: str) -> str:
    if len(text) <= MAX_OBSERVATION:
        return text
    return text[:MAX_OBSERVATION] + f"\n[... truncated {len(text) - MAX_OBSERVATION} characters]"


def run_tool(docs: list[dict[str, Any]], name: str, arguments: str) -> tuple[str, bool]:
    """(the tool's text, whether it ends the episode), with DocRead's semantics and error texts."""
    try:
        args = json.loads(arguments)
    except ValueError:
        return f"the arguments of {name!r} are not valid JSON", False
    if not isinstance(args, dict):
        return f"the arguments of {name!r} must be an object", False
    if name == "answer":
        text = args.get("text")
        if not isinstance(text, str):
            return "missing argument(s) ['text'] for tool 'answer'; it takes ['text']", False
        return text.strip(), True
    if name != "read":
        return f"unknown tool {name!r}; available tools: read, answer", False
    doc = args.get("doc")
    last = len(docs) - 1
    if isinstance(doc, str) and _bare(doc).isdigit():
        doc = int(_bare(doc))
    if isinstance(doc, int) and not isinstance(doc, bool):
        if not 0 <= doc <= last:
            return f"no document [{doc}]: choose a number from 0 to {last}", False
        return f"[{doc}] {docs[doc]['title']}\n{docs[doc]['text']}", False
    if isinstance(doc, str):
        for i, d in enumerate(docs):
            if _bare(d["title"]) == _bare(doc):
                return f"[{i}] {d['title']}\n{d['text']}", False
        return f"no document titled {doc!r}: give its number from 0 to {last}", False
    return "missing argument(s) ['doc'] for tool 'read'; it takes ['doc']", False


@dataclass(frozen=True)
class DocReadAgent:
    """DocRead as an `openai`-SDK agent: the documents' titles in the first user message, `read(doc)` shows one,
    `answer(text)` ends the episode. `budget` non-final turns (tool calls and replies without one alike), then
    one last turn to answer, else no answer: DocRead-v0's budget. A reply without a tool call gets the env's
    error text back as a user message (the API has no tool message without a call to answer)."""

    budget: int
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None

    def __call__(self, task: dict[str, Any], base_url: str) -> str:
        from openai import OpenAI

        client = OpenAI(base_url=base_url, api_key="sleuth", max_retries=0, timeout=3600)
        docs = task["payload"]["docs"]
        titles = "\n".join(f"[{i}] {d['title']}" for i, d in enumerate(docs))
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": f"Question: {task['question']}\n\nDocuments:\n{titles}"}]
        seed = {"seed": self.seed} if self.seed is not None else {}
        left = self.budget
        while True:
            reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS,
                                                   max_tokens=self.max_tokens, temperature=self.temperature, **seed)
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            calls = message.tool_calls or []
            text, final = run_tool(docs, calls[0].function.name, calls[0].function.arguments) if calls else (
                NO_CALL, False)
            if final:
                return text
            left -= 1
            if left < 0:
                return ""  # out of budget: no answer, as the env truncates
            note = f"({left} reads left)" if left > 0 else "(no reads left: call answer now)"
            if not calls:
                messages.append({"role": "user", "content": _clip(f"{text}\n{note}")})
            for k, call in enumerate(calls):
                content = _clip(f"{text}\n{note}") if k == 0 else "(only one tool call per turn: ignored)"
                messages.append({"role": "tool", "tool_call_id": call.id, "content": content})


# -- section episodes: arm A (sleuth's loop) vs arm B (the agent through the gateway) ---------------------------
class Busy:
    """A policy wrapper that counts `generate` calls, their requests and the time during which at least one runs."""

    def __init__(self, inner: Any):
        self.inner, self.name, self.tokenizer = inner, inner.name, inner.tokenizer
        self.parallel_calls = inner.parallel_calls
        self.busy_s, self.calls, self.requests, self._active, self._since = 0.0, 0, 0, 0, 0.0
        self._lock = threading.Lock()

    @property
    def version(self) -> int:
        return self.inner.version

    @property
    def max_context(self) -> int | None:
        return self.inner.max_context

    def generate(self, requests: list[Any], sampling: Any) -> list[Any]:
        with self._lock:
            if self._active == 0:
                self._since = time.perf_counter()
            self._active += 1
            self.calls += 1
            self.requests += len(requests)
        try:
            return self.inner.generate(requests, sampling)
        finally:
            with self._lock:
                self._active -= 1
                if self._active == 0:
                    self.busy_s += time.perf_counter() - self._since


@dataclass
class Arm:
    name: str
    wall_s: float
    episodes: dict[str, list[Any]]  # task id → the episode's records, in segment order
    busy_s: float
    calls: int
    requests: int

    def stats(self) -> dict[str, float]:
        eps = list(self.episodes.values())
        ok = [e for e in eps if not any(t.failed for t in e)]
        records = [t for e in ok for t in e]
        gen = sum(t.num_policy_tokens for t in records)
        prompt = 0
        for t in records:  # each call's prompt is the whole context so far
            ctx = len(t.prompt_ids)
            for turn in t.turns:
                prompt += ctx
                ctx += len(turn.action_ids) + len(turn.observation_ids)
        n = max(1, len(ok))
        return {"episodes": len(eps), "failed": len(eps) - len(ok), "wall_s": self.wall_s,
                "per_min": 60 * len(ok) / self.wall_s, "turns": sum(len(t.turns) for t in records) / n,
                "gen": gen / n, "prompt": prompt / n, "gen_tok_s": gen / self.wall_s, "busy": self.busy_s / self.wall_s,
                "calls": self.calls, "batch": self.requests / max(1, self.calls),
                "reward": statistics.mean(t.reward for t in records) if records else 0.0}


def _progress(total: int, desc: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="episode", file=sys.stderr, leave=False)


def warm_up(policy: Any, prompt: list[int]) -> None:
    """One short call on a prompt of no measured task, so neither arm pays the engine's first-call costs."""
    from sleuth.agents.policy import Request, SamplingParams
    from sleuth.tasks.base import Task

    policy.generate([Request(prompt, [], Task(id="warm-up", question=""))], SamplingParams(max_tokens=4))


def loop_arm(policy: Busy, tasks: list[Any], sampling: Any, concurrency: int, budget: int) -> Arm:
    import sleuth
    from sleuth.agents.loop import run_episodes

    make = lambda: sleuth.make("DocRead-v0", harness="json", budget=budget)  # noqa: E731
    episodes: dict[str, list[Any]] = {}
    with _progress(len(tasks), "A: sleuth loop") as bar:
        start = time.perf_counter()
        for t in run_episodes(make, tasks, policy, sampling, concurrency):
            episodes[t.task_id] = [t]
            bar.update()
        wall = time.perf_counter() - start
    return Arm("A: sleuth loop, DocRead-v0", wall, episodes, policy.busy_s, policy.calls, policy.requests)


def gateway_arm(policy: Busy, tasks: list[Any], sampling: Any, concurrency: int, budget: int) -> Arm:
    from sleuth.agents.agent_runner import run_agent_episodes
    from sleuth.agents.gateway import Gateway, create_app
    from sleuth.net import in_thread

    gw = Gateway(policy, sampling)
    agent = DocReadAgent(budget, sampling.max_tokens, sampling.temperature, sampling.seed)
    episodes: dict[str, list[Any]] = {}
    try:
        with in_thread(create_app(gw)) as url, _progress(len(tasks), "B: openai agent → gateway") as bar:
            start = time.perf_counter()
            for t in run_agent_episodes(agent, tasks, gw, url, "qa", concurrency):
                episodes.setdefault(t.task_id, []).append(t)
                bar.update(t.segment == t.segments - 1 or t.failed)
            wall = time.perf_counter() - start
    finally:
        gw.close()
    return Arm("B: openai-SDK agent → gateway", wall, episodes, policy.busy_s, policy.calls, policy.requests)


def sameness(a: Arm, b: Arm) -> str:
    """How alike the two arms' work was: first prompts and whole token sequences, task by task."""
    first = whole = 0
    for task_id, ea in a.episodes.items():
        eb = b.episodes.get(task_id, [])
        if not eb or any(t.failed for t in ea + eb):
            continue
        first += ea[0].prompt_ids == eb[0].prompt_ids
        whole += len(eb) == 1 and ea[0].token_ids() == eb[0].token_ids()
    return (f"first prompts token-identical in {first}/{len(a.episodes)} tasks; whole episodes token-identical in "
            f"{whole}/{len(a.episodes)} (expected to part after a reply without a tool call: the env answers it "
            "with a tool message, the agent with a user message, as the API has no tool message without a call)")


def arms_table(engine: str, a: Arm, b: Arm) -> list[str]:
    sa, sb = a.stats(), b.stats()
    out = ["| engine · arm | episodes (failed) | wall s | episodes/min | B/A | turns/episode | "
           "generated tok/episode | prompt tok/episode (all calls) | generated tok/s | B/A | engine busy | "
           "engine calls | requests per call | mean reward |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm, s in ((a, sa), (b, sb)):
        out.append(f"| {engine} · {arm.name} | {s['episodes']} ({s['failed']}) | {s['wall_s']:.1f} | "
                   f"{s['per_min']:.2f} | {s['per_min'] / sa['per_min']:.2f}× | {s['turns']:.2f} | {s['gen']:.1f} | "
                   f"{s['prompt']:.0f} | {s['gen_tok_s']:.1f} | {s['gen_tok_s'] / sa['gen_tok_s']:.2f}× | "
                   f"{s['busy']:.0%} | {s['calls']} | {s['batch']:.2f} | {s['reward']:.3f} |")
    out += ["", f"Same work? {sameness(a, b)}."]
    return out


def check_agent_matches_env() -> None:
    """Arm B's prompt must be the env's: its instructions and tool schemas are DocRead-v0's."""
    import sleuth

    env = sleuth.make("DocRead-v0", harness="json").unwrapped
    if env.instructions != INSTRUCTIONS or env._schemas != TOOLS:
        raise SystemExit("bench/gateway.py: DocReadAgent's INSTRUCTIONS/TOOLS no longer match DocRead-v0's: "
                         "update them")


def episodes_section(args: argparse.Namespace, tasks: list[Any], warm: list[int]) -> list[str]:
    from sleuth.agents.policy import SamplingParams, load_policy

    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    arms = []
    for run in (loop_arm, gateway_arm):  # a fresh engine per arm: no KV state kept from the other arm
        policy = Busy(load_policy(args.model, max_batch=max(8, args.concurrency)))
        warm_up(policy.inner, warm)
        arms.append(run(policy, tasks, sampling, args.concurrency, args.budget))
        print(f"  {arms[-1].name}: {arms[-1].stats()['per_min']:.2f} episodes/min", file=sys.stderr, flush=True)
    head = (f"{len(tasks)} HotpotQA test tasks, {args.concurrency} episodes live, budget {args.budget} reads, "
            f"max_tokens {args.max_tokens}, {_sampling_words(args)}, engine transformers `{args.model}` "
            f"(max_batch {max(8, args.concurrency)}, a fresh one per arm):")
    return [head, "", *arms_table("transformers", *arms), "",
            "Requests per call: how many episodes' turns the engine batched into one `generate` call."]


def _sampling_words(args: argparse.Namespace) -> str:
    return "greedy" if args.temperature == 0 else f"T = {args.temperature:g}, seed {args.seed}"


def vllm_section(args: argparse.Namespace, tasks: list[Any], warm: list[int]) -> list[str]:
    from sleuth.training.vllm_rollout import default_vllm_python

    python = default_vllm_python()
    if python is None or not Path(python).exists():
        reason = "vLLM arm skipped: no .venv-vllm/bin/python (`make vllm` builds it) and no $SLEUTH_VLLM_PYTHON"
        print(reason, file=sys.stderr)
        return [reason]
    import httpx

    from sleuth.agents.models import resolve_model
    from sleuth.agents.policy import SamplingParams
    from sleuth.training.config import load_config
    from sleuth.training.vllm_rollout import VLLMRollout

    print(f"… starting a vLLM server with {python}", file=sys.stderr, flush=True)
    cfg = load_config(overrides={"rollout.engine": "vllm", "rollout.concurrency": args.concurrency})
    vllm = VLLMRollout(cfg, resolve_model(args.model), warm[:8])
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    arms = []
    try:
        for run in (loop_arm, gateway_arm):
            for url in vllm.urls:  # no prefix cached by the other arm
                httpx.post(f"{url}/reset_prefix_cache", timeout=60).raise_for_status()
            policy = Busy(vllm.policy)
            warm_up(policy, warm)
            policy.busy_s, policy.calls, policy.requests = 0.0, 0, 0
            arms.append(run(policy, tasks, sampling, args.concurrency, args.budget))
            print(f"  vLLM {arms[-1].name}: {arms[-1].stats()['per_min']:.2f} episodes/min", file=sys.stderr,
                  flush=True)
    finally:
        vllm.close()
    head = (f"The same tasks and settings on one vLLM server (`{python}`, prefix caching on, reset between arms; "
            "each request its own call, batched by the server):")
    return [head, "", *arms_table("vLLM", *arms)]


# -- section overhead: the gateway in front of an instant policy ---------------------------------------------
REPLY = '<tool_call>\n{"name": "read", "arguments": {"doc": 1}}\n</tool_call>'


class InstantPolicy:
    """A test double that answers every request with the same short tool call (`REPLY` and the end-of-turn token,
    as ids of the real tokenizer), at once or after `delay_s` per call (a paced engine: the requests that queue
    meanwhile go into the next call): what is measured is the gateway, not a model."""

    name, version, max_context, parallel_calls = "instant", 0, None, 1

    def __init__(self, tokenizer: Any, delay_s: float = 0.0):
        from sleuth.agents.policy import Generation

        self.tokenizer, self.delay_s = tokenizer, delay_s
        self.calls = self.requests = 0
        ids = tokenizer.encode(REPLY, add_special_tokens=False) + [tokenizer.eos_token_id]
        self._generation = Generation(ids, [0.0] * len(ids), tokenizer.decode(ids, skip_special_tokens=True))

    def generate(self, requests: list[Any], sampling: Any) -> list[Any]:
        self.calls, self.requests = self.calls + 1, self.requests + len(requests)
        if self.delay_s:
            time.sleep(self.delay_s)
        g = self._generation
        return [type(g)(list(g.ids), list(g.logprobs), g.text) for _ in requests]


def instant_gateway() -> Any:
    """A `Gateway` over a fresh `InstantPolicy` with SmolLM2's tokenizer."""
    from sleuth.agents.gateway import Gateway
    from sleuth.agents.policy import SamplingParams, load_tokenizer

    return Gateway(InstantPolicy(load_tokenizer("smollm2")), SamplingParams(max_tokens=INSTANT_MAX_TOKENS))


class InstantGateway:
    """The gateway over an `InstantPolicy`, its app wrapped to time each chat completion inside the server (from
    the request reaching the app to its answer's last byte handed to uvicorn) and each call's time in the engine
    (`Gateway._generate`: waiting for the engine and its call), per session. Served in a child process, it
    answers `GET /bench/times` (the times since the last ask, then cleared) and `POST /bench/engine-ms/{ms}`."""

    def __init__(self) -> None:
        from sleuth.agents.gateway import create_app

        self.gw = instant_gateway()
        self.policy: InstantPolicy = self.gw.policy.inner
        self.app = create_app(self.gw)
        self.server: list[float] = []
        self.engine: dict[str, list[float]] = {}
        self._lock = threading.Lock()
        generate = self.gw._generate

        def timed_generate(s: Any, *args: Any) -> Any:
            start = time.perf_counter()
            try:
                return generate(s, *args)
            finally:
                with self._lock:
                    self.engine.setdefault(s.task.id, []).append(time.perf_counter() - start)

        self.gw._generate = timed_generate

    def take(self) -> dict[str, Any]:
        with self._lock:
            out = {"server": self.server, "engine": self.engine,
                   "batch": self.policy.requests / max(1, self.policy.calls)}
            self.server, self.engine = [], {}
            self.policy.calls = self.policy.requests = 0
        return out

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and path.startswith("/bench/"):
            if path.startswith("/bench/engine-ms/"):
                self.policy.delay_s = float(path.rsplit("/", 1)[1]) / 1000
            body = json.dumps(self.take() if path == "/bench/times" else {}).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
            return
        if scope["type"] != "http" or not path.endswith("/chat/completions"):
            return await self.app(scope, receive, send)
        start = time.perf_counter()

        async def timed_send(message: dict[str, Any]) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                with self._lock:
                    self.server.append(time.perf_counter() - start)

        await self.app(scope, receive, timed_send)


def serve_instant(port: int) -> None:
    """The instant gateway, served by uvicorn in this process (the bench's own child)."""
    import uvicorn

    uvicorn.run(InstantGateway(), host="127.0.0.1", port=port, log_level="error")


def conversation(call: Callable[[list[dict[str, Any]]], dict[str, Any]], task: Any, calls: int) -> list[float]:
    """One session: `calls` calls of a DocRead conversation that grows by the reply and its tool result each call
    (append-only, so every call extends the previous one). The seconds each call took."""
    docs = task.payload["docs"]
    titles = "\n".join(f"[{i}] {d['title']}" for i, d in enumerate(docs))
    messages: list[dict[str, Any]] = [{"role": "system", "content": INSTRUCTIONS},
                                      {"role": "user", "content": f"Question: {task.question}\n\nDocuments:\n{titles}"}]
    took = []
    for _ in range(calls):
        start = time.perf_counter()
        message = call(messages)
        took.append(time.perf_counter() - start)
        messages.append(message)
        tc = message["tool_calls"][0]
        text, _ = run_tool(docs, tc["function"]["name"], tc["function"]["arguments"])
        messages.append({"role": "tool", "tool_call_id": tc["id"], "content": text})
    return took


Call = Callable[[list[dict[str, Any]]], dict[str, Any]]


def sdk_session(base_url: str) -> Call:
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="sleuth", max_retries=0, timeout=600)

    def call(messages: list[dict[str, Any]]) -> dict[str, Any]:
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS,
                                               max_tokens=INSTANT_MAX_TOKENS)
        return reply.choices[0].message.model_dump(exclude_none=True)

    return call


def httpx_session(base_url: str) -> Call:
    import httpx

    client = httpx.Client(timeout=600)

    def call(messages: list[dict[str, Any]]) -> dict[str, Any]:
        resp = client.post(f"{base_url}/chat/completions", json={
            "model": "policy", "messages": messages, "tools": TOOLS, "max_tokens": INSTANT_MAX_TOKENS})
        resp.raise_for_status()
        return resp.json()["choices"][0]["message"]

    return call


def direct_session(gw: Any, session: str) -> Call:
    def call(messages: list[dict[str, Any]]) -> dict[str, Any]:
        return gw.complete(session, messages, TOOLS, None).choices[0].message

    return call


def policy_session(policy: InstantPolicy) -> Call:
    """The floor: the policy's own call, on the ids of a fixed prompt (the reply's message built once)."""
    from sleuth.agents.policy import Request, SamplingParams
    from sleuth.tasks.base import Task

    request = Request([1, 2, 3], [], Task(id="floor", question=""))
    sampling = SamplingParams(max_tokens=INSTANT_MAX_TOKENS)
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "read", "arguments": '{"doc": 1}'}}]}

    def call(messages: list[dict[str, Any]]) -> dict[str, Any]:
        policy.generate([request], sampling)
        return message

    return call


def _ms(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return 1000 * xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def cpu_seconds(pid: int | None) -> float:
    """CPU time (user + system) of process `pid` so far (this process if None); NaN where /proc is missing."""
    if pid is None:
        return time.process_time()
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load(sessions: int, threads: int, calls: int, task: Any, make: Callable[[int], Call],
         cpu_pid: int | None = None) -> dict[str, Any]:
    """`sessions` sessions of `calls` calls from `threads` threads (`threads` sessions at once; a thread's next
    session starts when its last ends), each session's client made before the clock starts: calls/s, p50/p99 ms
    per call seen by the client, CPU ms per call of process `cpu_pid` (default: this one), and under "took" each
    session's call times (seconds, in order)."""
    barrier = threading.Barrier(threads + 1)
    took: dict[int, list[float]] = {}
    errors: list[BaseException] = []

    def worker(w: int) -> None:
        try:
            clients = [(i, make(i)) for i in range(w, sessions, threads)]
        except BaseException as e:
            errors.append(e)
            barrier.abort()
            return
        try:
            barrier.wait()
            for i, call in clients:
                took[i] = conversation(call, task, calls)
        except BaseException as e:
            errors.append(e)

    workers = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(threads)]
    for t in workers:
        t.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    cpu0, start = cpu_seconds(cpu_pid), time.perf_counter()
    for t in workers:
        t.join()
    wall, cpu = time.perf_counter() - start, cpu_seconds(cpu_pid) - cpu0
    if errors:
        raise RuntimeError(f"{len(errors)} session(s) failed; the first: {type(errors[0]).__name__}: {errors[0]}")
    lat = [x for t in took.values() for x in t]
    return {"calls": len(lat), "cps": len(lat) / wall, "p50": _ms(lat, 0.5), "p99": _ms(lat, 0.99),
            "cpu_ms": 1000 * cpu / len(lat), "took": took}


@contextmanager
def own_process_gateway() -> Iterator[tuple[str, int]]:
    """The instant gateway served by a child process of this bench: (url, pid)."""
    from sleuth.net import free_port, wait_healthy

    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve-instant", str(port)], stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout_s=120, proc=proc)
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _end_sessions(url: str, names: list[str]) -> int:
    """Close the sessions over HTTP; the number of segments beyond one per session (should be 0)."""
    import httpx

    with httpx.Client(timeout=60) as client:
        return sum(client.delete(f"{url}/s/{n}").json()["segments"] - 1 for n in names)


def overhead_section(args: argparse.Namespace, task: Any) -> list[str]:
    import httpx

    from sleuth.net import in_thread

    n, k, engine_ms = args.sessions, args.calls, args.engine_ms
    rows: list[tuple[str, str, dict[str, Any]]] = []
    extra_segments = 0

    def http_rows(url: str, pid: int | None, where: str, control: Callable[[str], dict[str, Any]]) -> None:
        nonlocal extra_segments
        load(4, 4, 2, task, lambda i: httpx_session(f"{url}/s/warm-{i}-{uuid.uuid4().hex[:6]}/v1"), pid)
        for client, make in (("openai SDK", sdk_session), ("raw httpx", httpx_session)):
            for threads, delay in ((n, 0), (1, 0), (n, engine_ms)):
                control(f"/bench/engine-ms/{delay}")
                names = [f"{client.split()[-1]}-{threads}-{delay}-{i}-{uuid.uuid4().hex[:6]}" for i in range(n)]
                control("/bench/times")
                r = load(n, threads, k, task, lambda i, names=names, make=make: make(f"{url}/s/{names[i]}/v1"), pid)
                times = control("/bench/times")
                # the gateway's own part of a call: its latency less its time in the engine (waiting, generating)
                overhead = [lat - eng for i, name in enumerate(names)
                            for lat, eng in zip(r["took"][i], times["engine"][name], strict=True)]
                r.update(server_p50=_ms(times["server"], 0.5), server_p99=_ms(times["server"], 0.99),
                         over_p50=_ms(overhead, 0.5), over_p99=_ms(overhead, 0.99), batch=times["batch"])
                extra_segments += _end_sessions(url, names)
                at_once = f"{n} sessions at once" if threads > 1 else f"{n} sessions one at a time"
                rows.append((f"{client} → gateway {where}, {at_once}", f"{delay:g} ms", r))
                print(f"  {rows[-1][0]}, engine {delay} ms: p50 {r['p50']:.2f} ms, overhead p50 {r['over_p50']:.2f} "
                      f"ms, {r['cps']:.0f} calls/s", file=sys.stderr, flush=True)
        control("/bench/engine-ms/0")

    print("… gateway in a process of its own", file=sys.stderr, flush=True)
    with own_process_gateway() as (url, pid), httpx.Client(timeout=60) as http:
        http_rows(url, pid, "(own process)", lambda path: http.get(f"{url}{path}").json())
    print("… gateway in this process", file=sys.stderr, flush=True)
    inst = InstantGateway()

    def control(path: str) -> dict[str, Any]:
        if path.startswith("/bench/engine-ms/"):
            inst.policy.delay_s = float(path.rsplit("/", 1)[1]) / 1000
        return inst.take() if path == "/bench/times" else {}

    try:
        with in_thread(inst) as url:
            http_rows(url, None, "(this process, as `sleuth eval --agent`)", control)
        names = [f"direct-{i}" for i in range(n)]
        r = load(n, n, k, task, lambda i: direct_session(inst.gw, names[i]))
        ended = [inst.gw.end(s).segments for s in names]
        extra_segments += sum(len(segments) - 1 for segments in ended)
        context = len(ended[0][-1].token_ids())
        rows.append((f"`Gateway.complete`, no HTTP (the gateway's floor), {n} sessions at once", "0 ms", r))
        r = load(n, n, k, task, lambda i: policy_session(inst.policy))
        rows.append((f"the instant policy's `generate` alone (the floor), {n} threads", "0 ms", r))
    finally:
        inst.gw.close()
    out = [f"{n} sessions of {k} calls each, all at once and one at a time (unloaded); each call sends the whole "
           "DocRead-like conversation so far (system prompt, question and titles, every reply and document read: "
           f"{context} tokens by the end) with the two tools; the policy answers with `{REPLY!r}` (max_tokens "
           f"{INSTANT_MAX_TOKENS}) at once, or {engine_ms:g} ms after each call starts (a paced engine: what "
           "queues meanwhile is the next call's batch). **Client**: a call's latency seen by the agent's client. "
           "**Server**: from the request reaching the gateway's app to its answer's last byte handed to uvicorn. "
           "**Overhead**: the client's latency less the call's time in the engine (`Gateway._generate`: waiting "
           "for the engine, then its call): the gateway's own cost per call, HTTP and the client included, "
           "generation excluded. **CPU**: the gateway process's CPU time per call where the gateway has a process "
           "of its own, else this whole process's (clients included). **Requests per engine call**: how many "
           "sessions' calls the gateway batched into one `generate` (all of them, ideally, with a paced engine).",
           "",
           "| client → server | engine per call | calls | calls/s | client p50 ms | client p99 ms | server p50 ms | "
           "server p99 ms | overhead p50 ms | overhead p99 ms | CPU ms/call | requests per engine call |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, engine, r in rows:
        timed = (f"{r['server_p50']:.3f} | {r['server_p99']:.3f} | {r['over_p50']:.3f} | {r['over_p99']:.3f}"
                 if "server_p50" in r else "– | – | – | –")
        batch = f"{r['batch']:.1f}" if "batch" in r else "–"
        out.append(f"| {name} | {engine} | {r['calls']} | {r['cps']:.0f} | {r['p50']:.3f} | {r['p99']:.3f} | "
                   f"{timed} | {r['cpu_ms']:.3f} | {batch} |")
    out += ["", f"Every session recorded as one segment (no split): {'yes' if extra_segments == 0 else 'NO'}"
            f"{'' if extra_segments == 0 else f' ({extra_segments} extra segments)'}.", ""]
    return out + breakdown(task, k)


# -- where one call's time goes ----------------------------------------------------------------------------------
@contextmanager
def stage_timers(spent: dict[str, float]) -> Iterator[None]:
    """Time the gateway's parts of a call (seconds summed into `spent`) by wrapping them for the duration."""
    from sleuth.agents.chat import ChatRenderer
    from sleuth.agents.gateway import recorder, render, server

    targets = [(recorder, "normalise", "normalise"), (recorder.Gateway, "complete", "complete"),
               (recorder.Gateway, "_extension", "extension"), (ChatRenderer, "observation_ids", "render_new"),
               (recorder.Gateway, "_generate", "engine"), (render.ChatFormat, "reply", "reply"),
               (server, "completion_body", "body")]
    originals = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in targets]

    def timed(fn: Callable[..., Any], key: str) -> Callable[..., Any]:
        def wrapper(*a: Any, **kw: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[key] = spent.get(key, 0.0) + time.perf_counter() - start

        return wrapper

    for (obj, attr, key), (_, _, fn) in zip(targets, originals, strict=True):
        setattr(obj, attr, timed(fn, key))
    try:
        yield
    finally:
        for obj, attr, fn in originals:
            setattr(obj, attr, fn)


def breakdown(task: Any, calls: int, sessions: int = 20) -> list[str]:
    """Mean µs per call of each part, one session at a time (no load), over `sessions` sessions of `calls` calls:
    stage timers around the gateway's parts in process, then the same sessions over HTTP with httpx and with the
    SDK (gateway in this process): the HTTP and SDK parts are differences of mean latencies."""
    from sleuth.agents.gateway import create_app, server
    from sleuth.net import in_thread

    gw = instant_gateway()
    spent: dict[str, float] = {}
    latency: dict[str, list[float]] = {"direct": [], "httpx": [], "sdk": []}
    try:
        with in_thread(create_app(gw)) as url:
            conversation(httpx_session(f"{url}/s/warm/v1"), task, 2)
            for s in range(sessions):
                latency["direct"] += conversation(direct_session(gw, f"d{s}"), task, calls)
                latency["httpx"] += conversation(httpx_session(f"{url}/s/h{s}/v1"), task, calls)
                latency["sdk"] += conversation(sdk_session(f"{url}/s/o{s}/v1"), task, calls)
        done = gw.complete("body", [{"role": "user", "content": "x"}], TOOLS, None)
        with stage_timers(spent):
            for s in range(sessions):
                conversation(direct_session(gw, f"t{s}"), task, calls)
            for _ in range(sessions * calls):  # only the server calls it: timed on its own
                server.completion_body(gw, done, "policy", False)
    finally:
        gw.close()
    us = {key: 1e6 * v / (sessions * calls) for key, v in spent.items()}
    direct, via_httpx, via_sdk = (1e6 * statistics.mean(latency[k]) for k in ("direct", "httpx", "sdk"))
    parts = [("normalise the request's messages and the reply (`normalise`)", us["normalise"]),
             ("does it extend the last call? (`_extension`, less the rendering below)",
              us["extension"] - us["render_new"]),
             ("render + tokenise the new messages (`ChatRenderer.observation_ids`)", us["render_new"]),
             ("engine round trip: RequestQueue, its thread, the instant policy (`_generate`)", us["engine"]),
             ("the reply as OpenAI tool_calls (`ChatFormat.reply`)", us["reply"])]
    parts.append(("the rest of `Gateway.complete` (locks, json.dumps of the tools, bookkeeping)",
                  us["complete"] - sum(v for _, v in parts)))
    parts.append(("the response body (`completion_body`)", us["body"]))
    parts.append(("HTTP, server and client: uvicorn (h11), FastAPI (body parse + validation, thread hop, response "
                  "encoding), httpx", via_httpx - direct - us["body"]))
    parts.append(("the openai SDK's own client cost (SDK call − httpx call)", via_sdk - via_httpx))
    out = [f"Where one call's time goes, unloaded: 1 session at a time, {sessions} sessions × {calls} calls, mean "
           "µs per call:", "", "| part | µs/call |", "|---|---|"]
    out += [f"| {name} | {v:.0f} |" for name, v in parts]
    out += [f"| **total: `Gateway.complete` in process (untimed run)** | {direct:.0f} |",
            f"| **total: a call through httpx** | {via_httpx:.0f} |",
            f"| **total: a call through the openai SDK** | {via_sdk:.0f} |"]
    return out


# -- main ----------------------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # no `choices` here: Python 3.11's argparse checks a list default against them and refuses it
    ap.add_argument("sections", nargs="*", metavar="SECTION",
                    help=f"what to measure: {', '.join(SECTIONS)} (default: all)")
    ap.add_argument("--tasks", type=bounded(int, 1), help=f"HotpotQA test tasks per arm (default {DEFAULTS['tasks']})")
    ap.add_argument("--concurrency", type=bounded(int, 1),
                    help=f"episodes live at once, both arms (default {DEFAULTS['concurrency']})")
    ap.add_argument("--sessions", type=bounded(int, 1),
                    help=f"overhead: concurrent gateway sessions (default {DEFAULTS['sessions']})")
    ap.add_argument("--calls", type=bounded(int, 1), help=f"overhead: calls per session (default {DEFAULTS['calls']})")
    ap.add_argument("--quick", action="store_true",
                    help="small sizes for a smoke run: " + ", ".join(f"--{k} {v}" for k, v in QUICK.items()))
    ap.add_argument("--model", default="smollm2", help="the engine's model (default: the embedded SmolLM2)")
    ap.add_argument("--budget", type=bounded(int, 0), default=3, help="non-final turns per episode (DocRead's reads)")
    ap.add_argument("--max-tokens", type=bounded(int, 1), default=64, help="tokens per turn, both arms")
    ap.add_argument("--temperature", type=bounded(float, 0), default=0.0, help="0: greedy (default)")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed when --temperature > 0")
    ap.add_argument("--engine-ms", type=bounded(float, 0), default=100.0,
                    help="overhead: the paced engine's time per call in the third set of rows (default 100)")
    ap.add_argument("--dry-run", action="store_true", help="print the resolved settings and exit")
    ap.add_argument("--serve-instant", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    unknown = [x for x in args.sections if x not in SECTIONS]
    if unknown:
        ap.error(f"unknown section {unknown[0]!r}: choose from {', '.join(SECTIONS)}")
    if args.serve_instant is not None and not 1 <= args.serve_instant <= 65535:
        ap.error(f"--serve-instant wants a port, got {args.serve_instant}")
    for key, default in DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, QUICK[key] if args.quick else default)
    args.sections = list(dict.fromkeys(args.sections or SECTIONS))
    return args


def command_line() -> str:
    python = Path(sys.executable)
    try:
        python = python.relative_to(Path.cwd())
    except ValueError:
        pass
    return shlex.join([str(python), *sys.argv])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.serve_instant is not None:
        serve_instant(args.serve_instant)
        return
    settings = {k: getattr(args, k) for k in ("sections", "tasks", "concurrency", "sessions", "calls", "model",
                                             "budget", "max_tokens", "temperature", "seed", "engine_ms")}
    if args.dry_run:
        print(json.dumps(settings))
        return
    from common import cpu_name, publish

    from sleuth.agents.chat import ChatRenderer
    from sleuth.tasks import load_tasks

    check_agent_matches_env()
    load = os.getloadavg()[0]
    loaded = load_tasks("hotpotqa:test", limit=args.tasks + 1)
    tasks, spare = loaded[:args.tasks], loaded[-1]  # the spare task warms engines up and drives the overhead runs
    parts = []
    if {"episodes", "vllm"} & set(args.sections):
        from sleuth.agents.policy import load_tokenizer

        tok = load_tokenizer(args.model)
        warm = ChatRenderer(tok).prompt_ids([{"role": "user", "content": spare.question}])
    for section in args.sections:
        print(f"… {section}", file=sys.stderr, flush=True)
        if section == "episodes":
            lines = episodes_section(args, tasks, warm)
        elif section == "vllm":
            lines = vllm_section(args, tasks, warm)
        else:
            lines = overhead_section(args, spare)
        parts.append(f"## {section}\n\n" + "\n".join(lines))
        print(parts[-1], file=sys.stderr, flush=True)  # the whole report goes to stdout at the end
    head = (f"{cpu_name()}; load average {load:.2f} when it started. Command: `{command_line()}`.\n\n"
            "Targets (issue 33): B/A ≥ 0.8× episodes/min with transformers; gateway p50 ≤ 2 ms per call excluding "
            "generation.")
    publish("gateway", "Agents through the gateway vs sleuth's own loop; the gateway's cost per call",
            head + "\n\n" + "\n\n".join(parts))


if __name__ == "__main__":
    main()
