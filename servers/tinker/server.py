"""`sleuth serve tinker`: an HTTP server that speaks the Tinker SDK's protocol (tinker 0.38.0), so that
`tinker.ServiceClient(base_url=...)` and code written on it (tinker-cookbook's recipes) train and sample here.
Each route is a thin call into `TinkerService` (servers/tinker/service.py): model work is queued on its worker and
answered as a future; the rest answers at once."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from sleuth.servers.base import Server
from sleuth.servers.tinker.service import POLL_HOLD_S, PROTO, SDK_VERSION, Refused, TinkerService, refused


def add_routes(app: FastAPI, svc: TinkerService) -> None:
    api = "/api/v1"

    def future(request: Request, run: Callable[[], Any], **extra: Any) -> dict:
        rid = svc.jobs.submit(run, request.headers.get("x-idempotency-key"))
        return {"request_id": rid, **extra}

    def now(run: Callable[[], dict]) -> Any:
        try:
            return run()
        except Refused as e:
            return refused(str(e))

    @app.get("/health")
    def health() -> dict:
        return {"ok": True, "model": svc.models.served_name}

    @app.post(f"{api}/client/config")
    async def client_config(request: Request) -> Any:
        version = (await request.json()).get("sdk_version")
        if version != SDK_VERSION:
            return refused(f"this server speaks the tinker SDK {SDK_VERSION}, the client is {version}: "
                           f"pip install tinker=={SDK_VERSION}")
        # plain API-key auth, httpx transport, the chunks of one forward_backward sent in order
        return {"pjwt_auth_enabled": False, "use_pyqwest_transport": False, "parallel_fwdbwd_chunks": False}

    @app.post(f"{api}/client/dynamic_config")
    def dynamic_config() -> dict:
        return {"refresh_interval_sec": 300, "sample_cancel_enabled": False}

    @app.post(f"{api}/create_session")
    def create_session() -> dict:
        import uuid

        return {"type": "create_session", "session_id": f"s{uuid.uuid4().hex[:12]}"}

    @app.post(f"{api}/session_heartbeat")
    def heartbeat() -> dict:
        return {"type": "session_heartbeat"}

    @app.post(f"{api}/telemetry")
    def telemetry() -> dict:
        return {"status": "accepted"}  # nothing is recorded: the server keeps no telemetry

    @app.post(api + "/sessions/{session_id}/finish")
    def finish(session_id: str) -> dict:
        return {}

    @app.get(f"{api}/get_server_capabilities")
    def capabilities() -> dict:
        return {"supported_models": [{"model_name": svc.models.served_name, "max_context_length":
                                      svc.models.max_context, "trainable": True, "sampleable": True}]}

    @app.post(f"{api}/create_model")
    async def create_model(request: Request) -> dict:
        body = await request.json()
        model_id = f"{body['session_id']}:train:{body['model_seq_id']}"
        return future(request, lambda: svc.create_model(body), model_id=model_id)

    @app.post(f"{api}/get_info")
    async def get_info(request: Request) -> Any:
        body = await request.json()
        return now(lambda: svc.info(body["model_id"]))

    @app.post(f"{api}/forward_backward")
    async def forward_backward(request: Request) -> dict:
        body, encoding = await request.body(), request.headers.get("content-encoding")
        return future(request, lambda: svc.forward_backward(body, encoding))

    for route, method in (("optim_step", svc.optim_step), ("save_weights", svc.save_weights),
                          ("save_weights_for_sampler", svc.save_for_sampler), ("load_weights", svc.load_weights)):
        app.post(f"{api}/{route}")(_queued(future, method))

    @app.post(f"{api}/create_sampling_session")
    async def create_sampling_session(request: Request) -> Any:
        body = await request.json()
        return now(lambda: svc.create_sampling_session(body))

    @app.get(api + "/samplers/{sampler_id}")
    def sampler(sampler_id: str) -> Any:
        if sampler_id not in svc.sampling:
            return refused(f"no sampling session {sampler_id!r}", 404)
        weights = svc.sampling[sampler_id]
        path = None if weights is None else \
            f"tinker://{weights.parent.parent.name}/{weights.parent.name}/{weights.name}"
        return {"sampler_id": sampler_id, "base_model": svc.models.served_name, "model_path": path}

    @app.post(f"{api}/asample")
    async def asample(request: Request) -> Any:
        body = await request.json()
        try:
            call = svc.sample_call(body)
        except Refused as e:
            return refused(str(e))
        rid = svc.jobs.submit(call, request.headers.get("x-idempotency-key"))
        return {"request_id": rid, "sample_sequence_ids": [f"{rid}-{i}" for i in range(call.n)]}

    @app.post(f"{api}/retrieve_future")
    async def retrieve(request: Request) -> Any:
        import asyncio

        rid = (await request.json()).get("request_id")
        job = svc.jobs.get(rid)
        if job is None:  # 410: the SDK re-submits a sample; a training client raises
            return JSONResponse({"detail": f"no request {rid!r} here (the server restarted?)"}, status_code=410)
        if not await asyncio.to_thread(job.done.wait, POLL_HOLD_S):
            return {"type": "try_again", "request_id": rid, "queue_state": "active"}
        if job.error is not None:
            return {"error": job.error, "category": job.category}
        if isinstance(job.result, bytes):
            return Response(job.result, media_type=PROTO)
        return job.result

    @app.get(api + "/training_runs/{run_id}")
    def training_run(run_id: str) -> Any:
        return now(lambda: svc.training_run(run_id))

    @app.get(api + "/training_runs/{run_id}/checkpoints")
    def checkpoints(run_id: str) -> dict:
        return {"checkpoints": svc.checkpoints(run_id), "cursor": None}

    @app.delete(api + "/training_runs/{run_id}/checkpoints/{checkpoint_id:path}")
    def delete_checkpoint(run_id: str, checkpoint_id: str) -> Any:
        import shutil

        try:
            d = svc.path_dir(f"tinker://{run_id}/{checkpoint_id}")
        except Refused as e:
            return refused(str(e), 404)
        shutil.rmtree(d)
        return {}


def _queued(future: Callable[..., dict], method: Callable[[dict], dict]) -> Callable:
    async def handler(request: Request) -> dict:
        body = await request.json()
        return future(request, lambda: method(body))

    return handler


def make_app(service: TinkerService) -> FastAPI:
    app = FastAPI(title="sleuth tinker server")
    add_routes(app, service)
    return app


def build(args: argparse.Namespace) -> Server:
    """`sleuth serve tinker`'s server from its flags (`servers.catalog`): one base model, LoRA clients on it, and
    its sampler (the module itself, or a vLLM server loaded with verified syncs)."""
    from sleuth.agents.policies.models import EMBEDDED, EMBEDDED_HUB_ID, resolve_model
    from sleuth.servers.tinker.lora import LoraModels

    path = resolve_model(args.model)
    name = args.name or (EMBEDDED_HUB_ID if args.model == EMBEDDED else args.model)
    state_dir = Path(args.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    models = LoraModels(path, name, aliases=(args.model,))  # `--model smollm2` is asked for as "smollm2" too
    engine = models
    if args.sampler == "vllm":
        from sleuth.servers.tinker.vllm_sampler import VLLMSampler

        engine = VLLMSampler(models, args.vllm_python, args.vllm_arg)
    also = "".join(f" (also as {a!r})" for a in models.aliases)
    banner = (f"serving {name}{also} ({path}) for tinker {SDK_VERSION} clients at {{url}}, sampling on "
              f"{args.sampler}; checkpoints in {state_dir}")
    return Server(make_app(TinkerService(models, engine, state_dir)), banner,
                  engine.close if engine is not models else lambda: None)
