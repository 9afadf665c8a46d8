"""Envs behind HTTP: `sleuth serve env --env ID --port P [--max-sessions N]` (FastAPI on uvicorn). `--env FAMILY:*`
serves every env of a family, each session naming its own (the foreign-venv families start one such server per venv,
however many of its envs a process makes: `envs/families/venv_server.py`); the session limit is the server's.

POST   /sessions                  {"kwargs": {...}, "env": ID?} → {"session_id"}   (429 beyond max_sessions; `env`
                                  is required of a FAMILY:* server and must be the served id of any other)
POST   /sessions/{id}/reset       {"task": {...}?, "seed": int?}  → {"observation", "info"}
                                  (no task: the env takes its seed, as `env.reset(seed=...)` does in process)
POST   /sessions/{id}/step        {"action": "...", "seq": int?}
                                  → {"observation", "reward", "terminated", "truncated",
                                  "info"}
DELETE /sessions/{id}
GET    /health                    → {"env", "sessions", "max_sessions"}
Sessions idle longer than `session_timeout_s` are closed by a reaper; unknown ids are 404, a step before
reset is 409, malformed bodies 422. Env calls run in the server's thread pool (a code env's step waits on
its sandbox), one call at a time per session.

A step is made safe to retry by its `seq` (the client's number for it, counting up within the session):
the session remembers its last step's number and answer, and a step with that same number gets that
answer again without stepping the env, so a step whose answer was lost on the way is not taken twice.
A reset needs no number: a repeated reset starts the same episode again.

(No `from __future__ import annotations`: FastAPI must see the request models as real classes.)"""

import argparse
import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from sleuth.core.args import parse_kv
from sleuth.core.errors import BadInput
from sleuth.servers.base import Server

MAX_BODY_BYTES = 4 * 1024 * 1024


def create_app(served: str, env_kwargs: dict[str, Any] | None = None, max_sessions: int = 64,
               session_timeout_s: float = 600.0):
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, Field

    from sleuth.core.net import limit_body
    from sleuth.envs.families import FAMILIES
    from sleuth.envs.families.base import EnvFailure
    from sleuth.envs.outcome import wire
    from sleuth.envs.registry import UnknownEnvError, make
    from sleuth.envs.remote import MAX_ACTION_CHARS

    family = served.removesuffix(":*") if served.endswith(":*") else None
    if family is None:
        make(served, **(env_kwargs or {})).close()  # a bad env id or argument fails at start-up
    elif family not in FAMILIES:
        raise UnknownEnvError(f"no env family {family!r} (registered: {', '.join(FAMILIES.names())})")
    sessions: dict[str, dict[str, Any]] = {}
    lock = threading.Lock()

    class Create(BaseModel):
        kwargs: dict[str, Any] = Field(default_factory=dict)
        env: str | None = None  # the env to build: required of a FAMILY:* server

    def env_of(req: Create) -> tuple[str | None, str | None]:
        """(the env id the session asks for, None) or (None, why this server does not serve it)."""
        if family is None:
            return (served, None) if req.env in (None, served) else (None, f"this server serves {served}, "
                                                                              f"not {req.env}")
        if req.env is None or not req.env.startswith(f"{family}:"):
            return None, f"this server serves the {family} envs ({served}): name one as `env`, not {req.env!r}"
        return req.env, None

    class Reset(BaseModel):
        task: dict[str, Any] | None = None
        seed: int | None = None

    class Step(BaseModel):
        action: str = Field(max_length=MAX_ACTION_CHARS)
        seq: int | None = None  # the client's number for this step; None: not retried, never replayed

    def close(sid: str) -> None:
        with lock:
            s = sessions.pop(sid, None)
        if s is not None:
            with contextlib.suppress(Exception):
                s["env"].close()

    async def reap() -> None:
        while True:
            await asyncio.sleep(min(10.0, session_timeout_s / 2))
            now = time.monotonic()
            for sid in [k for k, s in list(sessions.items()) if now - s["used"] > session_timeout_s]:
                close(sid)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        task = asyncio.create_task(reap())
        yield
        task.cancel()
        for sid in list(sessions):
            close(sid)

    app = FastAPI(title=f"sleuth env server: {served}", lifespan=lifespan)
    limit_body(app, MAX_BODY_BYTES)

    def session(sid: str):
        s = sessions.get(sid)
        if s is None:
            return None, JSONResponse({"detail": f"no session {sid!r} (closed, timed out, or never opened)"}, 404)
        s["used"] = time.monotonic()
        return s, None

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "env": served, "sessions": len(sessions), "max_sessions": max_sessions}

    @app.post("/sessions")
    def create(req: Create):
        env_id, refused = env_of(req)
        if refused:
            return JSONResponse({"detail": refused}, 422)
        with lock:
            if len(sessions) >= max_sessions:
                return JSONResponse({"detail": f"the server is at its limit of {max_sessions} sessions"}, 429)
            sid = uuid.uuid4().hex
            sessions[sid] = {"env": None, "used": time.monotonic(), "reset": False, "lock": threading.Lock(),
                             "last_step": None}
        try:
            env = make(env_id, **{**(env_kwargs or {}), **req.kwargs})
        except Exception as e:  # a bad kwarg from this client: its mistake, not the server's
            with lock:
                sessions.pop(sid, None)
            return JSONResponse({"detail": f"cannot build {env_id}: {type(e).__name__}: {e}"}, 422)
        sessions[sid]["env"] = env
        return {"session_id": sid}

    @app.post("/sessions/{sid}/reset")
    def reset(sid: str, req: Reset):
        s, err = session(sid)
        if err:
            return err
        with s["lock"]:
            try:
                s["reset"], s["last_step"] = False, None  # a failed reset leaves nothing to step
                obs, info = s["env"].reset(seed=req.seed, options={"task": req.task} if req.task is not None else None)
            except EnvFailure as e:  # the env itself broke: its message, as a server error
                return JSONResponse({"detail": str(e)}, 500)
            except (ValueError, TypeError, KeyError) as e:
                return JSONResponse({"detail": f"reset failed: {type(e).__name__}: {e}"}, 422)
            s["reset"] = True
        return {"observation": obs, "info": _wire(wire(info))}

    @app.post("/sessions/{sid}/step")
    def step(sid: str, req: Step):
        s, err = session(sid)
        if err:
            return err
        with s["lock"]:  # a retry that arrives while its first try still runs waits for that try's answer
            last = s["last_step"]
            if req.seq is not None and last is not None and last[0] == req.seq:
                return last[1]  # this step was taken and its answer lost on the way: the same answer again
            if not s["reset"]:
                return JSONResponse({"detail": "reset the session before stepping it"}, 409)
            try:
                obs, reward, terminated, truncated, info = s["env"].step(req.action)
            except EnvFailure as e:
                return JSONResponse({"detail": str(e)}, 500)
            except RuntimeError as e:  # stepping a finished episode
                return JSONResponse({"detail": str(e)}, 409)
            if terminated or truncated:
                s["reset"] = False
            out = {"observation": obs, "reward": float(reward), "terminated": bool(terminated),
                   "truncated": bool(truncated), "info": _wire(wire(info))}
            s["last_step"] = (req.seq, out) if req.seq is not None else None
        return out

    @app.delete("/sessions/{sid}")
    def delete(sid: str):
        if sid not in sessions:
            return JSONResponse({"detail": f"no session {sid!r}"}, 404)
        close(sid)
        return {"closed": sid}

    return app


def _wire(value: Any) -> Any:
    """An env's info as JSON takes it: any sequence (a text env's lazily listed legal moves) as a list."""
    if isinstance(value, Mapping):
        return {k: _wire(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_wire(v) for v in value]
    return value


def build(args: argparse.Namespace) -> Server:
    """`sleuth serve env`'s server from its flags (`servers.catalog`)."""
    env_kwargs = parse_kv(args.env_arg)
    try:
        app = create_app(args.env, env_kwargs, args.max_sessions, args.session_timeout)
    except Exception as e:  # a bad env id or argument: one line instead of a traceback
        raise BadInput(f"cannot serve {args.env}: {type(e).__name__}: {e}") from None
    return Server(app, f"serving {args.env} on {{url}} (at most {args.max_sessions} sessions)")
