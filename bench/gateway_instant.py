"""The parts bench/gateway_overhead.py measures with: a policy that answers at once (a test double: a fixed
short tool call as ids of the real SmolLM2 tokenizer), the gateway in front of it, in this process or served
in its own, and the four ways a session calls it (openai SDK, raw httpx, the gateway without HTTP, the
policy alone)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from gateway_agent import INSTANT_MAX_TOKENS, INSTRUCTIONS, TOOLS, run_tool

REPLY = '<tool_call>\n{"name": "read", "arguments": {"doc": 1}}\n</tool_call>'


class InstantPolicy:
    """A test double that answers every request with the same short tool call (`REPLY` and the end-of-turn token,
    as ids of the real tokenizer), at once or after `delay_s` per call (a paced engine: the requests that queue
    meanwhile go into the next call): what is measured is the gateway, not a model."""

    name, version, max_context, parallel_calls = "instant", 0, None, 1

    def __init__(self, tokenizer: Any, delay_s: float = 0.0):
        from sleuth.agents.policies.base import Generation

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
    from sleuth.agents.policies.base import SamplingParams
    from sleuth.agents.policies.load import load_tokenizer

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
    from sleuth.tasks.qa import qa_docs

    docs = [d.to_dict() for d in qa_docs(task).docs]  # as the agent's tools see them: the task's JSON
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
    from sleuth.agents.policies.base import Request, SamplingParams
    from sleuth.tasks.base import Task

    request = Request([1, 2, 3], [], Task(id="floor", question=""))
    sampling = SamplingParams(max_tokens=INSTANT_MAX_TOKENS)
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "read", "arguments": '{"doc": 1}'}}]}

    def call(messages: list[dict[str, Any]]) -> dict[str, Any]:
        policy.generate([request], sampling)
        return message

    return call
