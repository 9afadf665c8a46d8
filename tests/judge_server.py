"""A scripted judge: an OpenAI-compatible chat server (FastAPI, served for real on a loopback port) whose reply to
each request a test decides: a text, an HTTP status to fail with, or a delay past the client's timeout."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse


@dataclass
class Hang:
    seconds: float


@dataclass
class ScriptedJudge:
    reply: Callable[[list[dict[str, str]]], str | int | Hang]  # the request's messages → what to answer
    requests: list[list[dict[str, str]]] = field(default_factory=list)

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        def health() -> dict[str, str]:
            return {"status": "ok"}

        @app.post("/v1/chat/completions")
        async def chat(body: dict[str, Any]) -> Any:
            messages = body["messages"]
            self.requests.append(messages)
            out = self.reply(messages)
            if isinstance(out, Hang):
                await asyncio.sleep(out.seconds)
                out = "SCORE: 0"
            if isinstance(out, int):
                return JSONResponse({"error": {"message": f"scripted {out}", "type": "server_error"}}, status_code=out)
            return {"id": f"judge-{len(self.requests)}", "object": "chat.completion", "created": int(time.time()),
                    "model": body["model"], "choices": [{"index": 0, "finish_reason": "stop",
                                                         "message": {"role": "assistant", "content": out}}],
                    "usage": {"prompt_tokens": sum(len(m["content"].split()) for m in messages),
                              "completion_tokens": len(out.split()), "total_tokens": 0}}

        return app


def judge_file(tmp_path, url: str, **settings: Any) -> str:
    """A judge file for the scripted judge at `url`; returns its `judge:` verifier name."""
    import yaml

    path = tmp_path / f"judge-{len(list(tmp_path.glob('judge-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump({"base_url": f"{url}/v1", "model": "scripted", "backoff_s": 0.01,
                                    "timeout_s": 5, **settings}, sort_keys=False))
    return f"judge:{path}"


def members_shown(messages: list[dict[str, str]]) -> list[str]:
    """The responses of a group judge's prompt, in the order the judge was shown them."""
    return re.findall(r"Response \d+:\n<<<\n(.*?)\n>>>", messages[-1]["content"], flags=re.S)
