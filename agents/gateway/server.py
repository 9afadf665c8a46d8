"""The gateway over HTTP: the OpenAI chat-completions API an unchanged agent points its `base_url` at.

`POST /s/{session}/v1/chat/completions` (streaming or not) and `GET /s/{session}/v1/models`, so an agent
needs nothing but `base_url=<gateway>/s/<session>/v1`; `/v1/...` without a session records into the
session named "default". Errors come in OpenAI's shape (`{"error": {"message", "type", "code"}}`): 400 for
a request that cannot be served (`context_length_exceeded` among them), 401 for a wrong key, 503 when the
engine fails. Any key is accepted unless the app is given one (`sleuth serve gateway` requires one when it
listens beyond loopback). A stream sends the reply once it is generated (the engine batches whole calls),
in OpenAI's chunk format."""

from __future__ import annotations

import contextlib
import functools
import json
import secrets
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from sleuth.agents.gateway.recorder import Completion, ContextOverflow, Gateway
from sleuth.agents.gateway.render import MessageError
from sleuth.agents.policies.base import SamplingParams
from sleuth.core.net import limit_body

MAX_BODY = 32 << 20
DEFAULT_SESSION = "default"


def _error(status: int, message: str, kind: str = "invalid_request_error", code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": code, "param": None}}, status_code=status)


def sampling_of(body: dict[str, Any], defaults: SamplingParams) -> SamplingParams:
    """The request's sampling parameters over the gateway's defaults; a bad value is a `MessageError`."""
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    values = {"max_tokens": defaults.max_tokens if max_tokens is None else max_tokens,
              "temperature": body.get("temperature", defaults.temperature),
              "top_p": body.get("top_p", defaults.top_p), "seed": body.get("seed", defaults.seed)}
    for key, low in (("max_tokens", 1), ("temperature", 0), ("top_p", 0)):
        v = values[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < low:
            raise MessageError(f"{key} must be a number ≥ {low}, got {v!r}")
    if values["seed"] is not None and (isinstance(values["seed"], bool) or not isinstance(values["seed"], int)):
        raise MessageError(f"seed must be an integer, got {values['seed']!r}")
    return SamplingParams(int(values["max_tokens"]), float(values["temperature"]), float(values["top_p"]),
                          values["seed"])


def _stop(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > 4:
        raise MessageError("stop must be a string or a list of at most 4 strings")
    return stop


ROLES = ("system", "developer", "user", "assistant", "tool")


def _check_messages(messages: list[Any]) -> None:
    """What OpenAI's API refuses with a 400 naming the field (sleuth's `Gateway` itself is lenient: replayed
    demonstrations may have tool messages without ids)."""
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ROLES:
            raise MessageError(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}")
        if role == "tool" and not isinstance(m.get("tool_call_id"), str):
            raise MessageError(f"messages[{i}].tool_call_id is missing: a tool message answers a tool call by its id")


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = body.get("tools") or None
    if tools is not None and not isinstance(tools, list):
        raise MessageError("tools must be a list")
    return None if body.get("tool_choice") == "none" else tools


def _logprobs(gw: Gateway, ids: list[int], logprobs: list[float]) -> dict[str, Any]:
    tok = gw.policy.tokenizer
    content = []
    for i, lp in zip(ids, logprobs, strict=True):
        text = tok.decode([i])
        content.append({"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": []})
    return {"content": content, "refusal": None}


def completion_body(gw: Gateway, done: Completion, model: str, want_logprobs: bool) -> dict[str, Any]:
    choices = [{"index": i, "message": {**c.message, "refusal": None}, "finish_reason": c.finish_reason,
                "logprobs": _logprobs(gw, c.ids, c.logprobs) if want_logprobs else None}
               for i, c in enumerate(done.choices)]
    completion = sum(len(c.ids) for c in done.choices)
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": choices, "system_fingerprint": f"sleuth-v{done.policy_version}",
            "usage": {"prompt_tokens": done.prompt_tokens, "completion_tokens": completion,
                      "total_tokens": done.prompt_tokens + completion}}


def stream_chunks(body: dict[str, Any], include_usage: bool) -> Iterator[str]:
    """A finished completion as OpenAI's server-sent chunks: the role, the content, the tool calls, the
    finish reason of each choice, the usage if asked for, then `[DONE]`."""
    base = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"], "model": body["model"],
            "system_fingerprint": body["system_fingerprint"]}

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
        return f"data: {json.dumps({**base, 'choices': choices, **extra}, ensure_ascii=False)}\n\n"

    for c in body["choices"]:
        m, i = c["message"], c["index"]
        yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        if m.get("content"):
            yield chunk([{"index": i, "delta": {"content": m["content"]}, "logprobs": c["logprobs"],
                          "finish_reason": None}])
        for k, call in enumerate(m.get("tool_calls") or []):
            yield chunk([{"index": i, "delta": {"tool_calls": [{"index": k, **call}]}, "finish_reason": None}])
        yield chunk([{"index": i, "delta": {}, "finish_reason": c["finish_reason"]}])
    if include_usage:
        yield chunk([], usage=body["usage"])
    yield "data: [DONE]\n\n"


def create_app(gw: Gateway, api_key: str | None = None, out: str | Path | None = None) -> FastAPI:
    """The app over `gw`. `DELETE /s/{session}` ends a session: with `out`, its trajectories are appended to
    `out/trajectories.jsonl` (one line each, under a lock: sessions end concurrently)."""
    write_lock = threading.Lock()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = 512  # every session may wait on the engine
        yield

    app = FastAPI(title="sleuth gateway", lifespan=lifespan)
    limit_body(app, MAX_BODY)

    def authorised(request: Request) -> bool:
        if api_key is None:
            return True
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        return secrets.compare_digest(given.encode(), api_key.encode())

    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": gw.model_name, "object": "model", "created": 0,
                                            "owned_by": "sleuth"}]}

    @app.delete("/s/{session}")
    def end(request: Request, session: str) -> Any:
        if not authorised(request):
            return _error(401, "wrong API key", "authentication_error", "invalid_api_key")
        episode = gw.end(session)
        if out is not None and episode.segments:
            Path(out).mkdir(parents=True, exist_ok=True)
            with write_lock, open(Path(out) / "trajectories.jsonl", "a", encoding="utf-8") as f:
                f.writelines(t.to_json() + "\n" for t in episode.segments)
        return {"session": session, "calls": episode.calls, "segments": len(episode.segments),
                "splits": episode.splits, "unused_choices": episode.unused_choices}

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "model": gw.model_name}

    @app.get("/v1/models")
    @app.get("/s/{session}/v1/models")
    def list_models(request: Request, session: str = DEFAULT_SESSION) -> Any:
        return models() if authorised(request) else _error(401, "wrong API key", "authentication_error")

    @app.post("/v1/chat/completions")
    @app.post("/s/{session}/v1/chat/completions")
    async def chat(request: Request, session: str = DEFAULT_SESSION) -> Response:
        """Async over the raw body: FastAPI's validation of a `dict` body and its encoding of the reply cost
        more per call than the gateway itself (bench/gateway.py); the engine call runs in a worker thread."""
        if not authorised(request):
            return _error(401, "wrong API key", "authentication_error", "invalid_api_key")
        try:
            body = json.loads(await request.body())
        except (ValueError, RecursionError):
            return _error(400, "the request body is not JSON")
        try:
            if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
                raise MessageError("the body must be an object with a list of messages")
            _check_messages(body["messages"])
            n = body.get("n", 1)
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise MessageError(f"n must be an integer ≥ 1, got {n!r}")
            call = functools.partial(gw.complete, session, body["messages"], _tools(body),
                                     sampling_of(body, gw.defaults), n, _stop(body))
            done = await anyio.to_thread.run_sync(call)
        except ContextOverflow as e:
            return _error(400, str(e), code="context_length_exceeded")
        except MessageError as e:
            return _error(400, str(e))
        except Exception as e:  # the engine failed: the agent may retry, the session is unchanged
            return _error(503, f"the engine failed: {type(e).__name__}: {e}", "server_error")
        reply = completion_body(gw, done, body.get("model") or gw.model_name, bool(body.get("logprobs")))
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(stream_chunks(reply, usage), media_type="text/event-stream")
        return Response(json.dumps(reply, ensure_ascii=False), media_type="application/json")

    return app
