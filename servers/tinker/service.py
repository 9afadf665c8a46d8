"""What `sleuth serve tinker` does behind its routes (servers/tinker/server.py): sessions, training clients,
sampling sessions, futures and checkpoint paths, as the Tinker SDK (tinker 0.38.0) expects them.

What the SDK expects (read from its source; docs/tinker.md): training and sampling calls answer at once with a
request id and their results are long-polled at `/api/v1/retrieve_future` (held here up to `POLL_HOLD_S`, then
`try_again`); `forward_backward` requests and the results of `forward_backward` and `sample` are protobuf
(servers/tinker/wire.py), everything else JSON; a failed request is `{"error": ..., "category": "user"}` (the
SDK raises it without retrying), a refused call a 400 with `{"detail": ...}` and `x-should-retry: false`.
Every model computation runs on one worker thread, in the order the requests came (a client's operations
arrive in its own order): the model, its adapters and optimizers belong to that thread (`Jobs`).

Checkpoints are directories under `--state-dir`, named by their `tinker://RUN/KIND/NAME` path, so a restarted
server serves the checkpoints of the one before it (`create_training_client_from_state` resumes a killed run)."""

from __future__ import annotations

import collections
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fastapi.responses import JSONResponse

from sleuth.core.errors import BadInput
from sleuth.servers.tinker.lora import AdapterSpec, LoraModels, Sampler
from sleuth.servers.tinker.losses import LossInputError
from sleuth.servers.tinker.wire import (
    SampledSequence,
    WireError,
    decode_forward_backward,
    encode_forward_backward,
    encode_sample,
)

SDK_VERSION = "0.38.0"  # the Tinker SDK release whose protocol this server speaks (tests/test_tinker_contract.py)
POLL_HOLD_S = 30.0  # a retrieve waits this long for its result before `try_again` (the SDK's poll timeout is 45 s)
KEEP_RESULTS = 4096  # finished results kept for re-reads (a client re-asks after a dropped connection)
PROTO = "application/x-protobuf"
_NAME = re.compile(r"^[A-Za-z0-9._\-]+$")


class Refused(BadInput):
    """A call this server refuses: answered 400 with the message (nothing changed)."""


@dataclass(frozen=True)
class SampleCall:
    """One `sample` request, parsed: calls with equal `batch_key` are generated together."""
    weights: Path | None
    prompt: tuple[int, ...]
    n: int
    params: tuple  # (max_tokens, temperature, top_p, top_k, stop, seed): the sampler's arguments after `ns`
    topk: int  # top-k prompt logprobs wanted (0: none)
    prompt_logprobs: bool

    @property
    def batch_key(self) -> tuple | None:
        """None for a call that runs alone: a seeded one (its own random stream) or one with prompt logprobs."""
        seeded = self.params[-1] is not None
        return None if seeded or self.prompt_logprobs or self.topk else (self.weights, self.params)


@dataclass
class Job:
    run: Callable[[], Any] | None  # None for a sample call, which the worker may batch with the next ones
    sample: SampleCall | None = None
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None  # a JSON-able dict, or bytes (protobuf)
    error: str | None = None
    category: str = "user"

    def fail(self, e: Exception) -> None:
        if isinstance(e, (LossInputError, WireError, Refused)):
            self.error = str(e)
        else:  # the server's own failure: reported to the client, the worker goes on
            self.error, self.category = f"{type(e).__name__}: {e}", "server"


class Jobs:
    """The worker thread and the results it produced, by request id. Jobs run in arrival order; sample calls that
    arrive in a row with the same weights and parameters run as one generation (`run_samples`): an RL loop sends
    a step's prompts as separate calls, and one batch of their rows costs far less than one generation each."""

    def __init__(self, run_samples: Callable[[list[SampleCall]], list[bytes]]) -> None:
        self._run_samples = run_samples
        self._pending: collections.deque[Job] = collections.deque()
        self._ready = threading.Condition()
        self._jobs: dict[str, Job] = {}
        self._order: list[str] = []
        self._by_key: dict[str, str] = {}  # X-Idempotency-Key → request id: a re-sent POST is not run twice
        self._lock = threading.Lock()
        threading.Thread(target=self._work, daemon=True, name="tinker-worker").start()

    def submit(self, run: Callable[[], Any] | SampleCall, key: str | None) -> str:
        with self._lock:
            if key and key in self._by_key:
                return self._by_key[key]
            rid = f"req-{uuid.uuid4().hex[:16]}"
            self._jobs[rid] = job = Job(None, run) if isinstance(run, SampleCall) else Job(run)
            self._order.append(rid)
            if key:
                self._by_key[key] = rid
            while len(self._order) > KEEP_RESULTS and self._jobs[self._order[0]].done.is_set():
                self._jobs.pop(self._order.pop(0))
        with self._ready:
            self._pending.append(job)
            self._ready.notify()
        return rid

    def get(self, rid: str) -> Job | None:
        with self._lock:
            return self._jobs.get(rid)

    def _next(self) -> list[Job]:
        with self._ready:
            while not self._pending:
                self._ready.wait()
            batch = [self._pending.popleft()]
            key = batch[0].sample.batch_key if batch[0].sample is not None else None
            while key is not None and self._pending and self._pending[0].sample is not None and \
                    self._pending[0].sample.batch_key == key:
                batch.append(self._pending.popleft())
            return batch

    def _work(self) -> None:
        while True:
            batch = self._next()
            try:
                results = [batch[0].run()] if batch[0].run is not None else \
                    self._run_samples([j.sample for j in batch])
                for job, result in zip(batch, results, strict=True):
                    job.result = result
            except Exception as e:
                if len(batch) == 1:
                    batch[0].fail(e)
                else:  # which call failed: each alone
                    for job in batch:
                        try:
                            job.result = self._run_samples([job.sample])[0]
                        except Exception as one:
                            job.fail(one)
            for job in batch:
                job.done.set()


class TinkerService:
    """Sessions, training clients, sampling sessions and checkpoint paths over one `LoraModels` and a sampler."""

    def __init__(self, models: LoraModels, sampler: Sampler, state_dir: Path):
        self.models = models
        self.sampler = sampler
        self.state_dir = state_dir
        self.jobs = Jobs(self.run_samples)
        self.sampling: dict[str, Path | None] = {}  # sampling session id → sampler weights (None: the base model)
        self.created: dict[str, float] = {}  # training run id → last request time

    # ---- paths ---------------------------------------------------------------------------------------------
    def path_dir(self, path: str) -> Path:
        m = re.fullmatch(r"tinker://([^/]+)/(weights|sampler_weights)/([^/]+)", path or "")
        if not m:
            raise Refused(f"{path!r} is not a checkpoint path of this server (tinker://RUN/weights/NAME or "
                          "tinker://RUN/sampler_weights/NAME)")
        run, kind, name = m.groups()
        d = self.state_dir / run / kind / name
        if not (d / "adapter.safetensors").exists():
            raise Refused(f"nothing was saved at {path} (save it first: save_state / save_weights_for_sampler)")
        return d

    def new_path(self, model_id: str, kind: str, name: str | None) -> tuple[str, Path]:
        name = name or f"{kind}-{uuid.uuid4().hex[:8]}"
        if not _NAME.match(name) or name in (".", ".."):
            raise Refused(f"checkpoint name {name!r}: use letters, digits, '.', '_' and '-' only")
        return f"tinker://{model_id}/{kind}/{name}", self.state_dir / model_id / kind / name

    def check_base_model(self, name: str | None) -> None:
        """Refuses a `base_model` that is not the one model served here, naming every name it answers to."""
        if name is None or not self.models.serves(name):
            names = " or ".join(repr(n) for n in (self.models.served_name, *self.models.aliases))
            raise Refused(f"base_model {name!r} is not served here; this server serves {names}")

    # ---- training ------------------------------------------------------------------------------------------
    def create_model(self, body: dict) -> dict:
        model_id = f"{body['session_id']}:train:{body['model_seq_id']}"
        self.check_base_model(body["base_model"])
        lora = body.get("lora_config") or {}
        rank = int(lora.get("rank", 32))
        if rank < 1:
            raise Refused(f"lora_config.rank must be ≥ 1, got {rank}")
        optimizer = (body.get("optimizer_config") or {}).get("type", "adamw")
        if optimizer != "adamw":
            raise Refused(f"optimizer {optimizer!r} is not served here; use AdamW (the default)")
        spec = AdapterSpec(self.models.served_name, rank, lora.get("train_attn", True), lora.get("train_mlp", True),
                           lora.get("train_unembed", True))
        why = self.sampler.refuses(spec)
        if why:
            raise Refused(why)
        self.models.create(model_id, spec, lora.get("seed"))
        self.created[model_id] = time.time()
        return {"model_id": model_id, "type": "create_model"}

    def forward_backward(self, body: bytes, encoding: str | None) -> bytes:
        req = decode_forward_backward(body, encoding)
        outputs, metrics = self.models.forward_backward(req.model_id, req.data, req.loss_fn, req.config,
                                                        req.forward_only)
        self.created[req.model_id] = time.time()
        return encode_forward_backward(outputs, metrics)

    def optim_step(self, body: dict) -> dict:
        adam = body.get("adam_params")
        if adam is None:
            raise Refused("optim_step: only AdamParams are served here")
        metrics = self.models.optim_step(body["model_id"], float(adam["learning_rate"]), float(adam.get("beta1", 0.9)),
                                         float(adam.get("beta2", 0.95)), float(adam.get("eps", 1e-12)),
                                         float(adam.get("weight_decay", 0.0)), float(adam.get("grad_clip_norm", 0.0)))
        return {"metrics": metrics}

    def save_weights(self, body: dict) -> dict:
        path, d = self.new_path(body["model_id"], "weights", body.get("path"))
        if d.exists() and not body.get("overwrite", False):
            raise Refused(f"{path} exists; pass overwrite=True or another name")
        self.models.save(body["model_id"], d, optimizer=True)
        return {"path": path, "type": "save_weights"}

    def save_for_sampler(self, body: dict) -> dict:
        path, d = self.new_path(body["model_id"], "sampler_weights", body.get("path"))
        self.models.save(body["model_id"], d, optimizer=False)
        if body.get("path") is not None:
            return {"path": path, "type": "save_weights_for_sampler"}
        sid = f"{body['model_id'].split(':')[0]}:sample:{body.get('sampling_session_seq_id', 0)}"
        self.sampling[sid] = d
        return {"path": path, "sampling_session_id": sid, "type": "save_weights_for_sampler"}

    def load_weights(self, body: dict) -> dict:
        model_id = body.get("model_id") or f"{body['session_id']}:train:{body['model_seq_id']}"
        d = self.path_dir(body["path"])
        if d.parent.name != "weights" and body.get("optimizer"):
            raise Refused(f"{body['path']} holds sampler weights only: load_state_with_optimizer needs a save_state")
        self.models.load(model_id, d, optimizer=bool(body.get("optimizer")))
        self.created[model_id] = time.time()
        return {"path": body["path"], "model_id": model_id, "type": "load_weights"}

    def info(self, model_id: str) -> dict:
        spec = self.models.client_spec(model_id)
        if spec is None:
            raise Refused(f"no training client {model_id!r} on this server")
        return {"type": "get_info", "model_id": model_id, "is_lora": True, "lora_rank": spec.rank,
                "model_name": spec.base_model, "optimizer_config": {"type": "adamw"},
                "model_data": {"arch": type(self.models.base).__name__, "model_name": spec.base_model,
                               "tokenizer_id": self.models.model_dir}}

    # ---- sampling ------------------------------------------------------------------------------------------
    def create_sampling_session(self, body: dict) -> dict:
        sid = f"{body['session_id']}:sample:{body['sampling_session_seq_id']}"
        if body.get("model_path"):
            self.sampling[sid] = self.path_dir(body["model_path"])
        else:
            self.check_base_model(body.get("base_model"))
            self.sampling[sid] = None
        return {"type": "create_sampling_session", "sampling_session_id": sid}

    def sample_call(self, body: dict) -> SampleCall:
        sid = body["sampling_session_id"]
        if sid not in self.sampling:
            raise Refused(f"no sampling session {sid!r} on this server (a restarted server forgets sessions: "
                          "create the sampling client again)")
        params = body.get("sampling_params") or {}
        stop = params.get("stop")
        stop = (stop,) if isinstance(stop, str) else None if stop is None else tuple(stop)
        n = int(body.get("num_samples", 1))
        if n < 1:
            raise Refused(f"num_samples must be ≥ 1, got {n}")
        return SampleCall(self.sampling[sid], tuple(t for c in body["prompt"]["chunks"] for t in _text_chunk(c)), n,
                          (params.get("max_tokens"), float(params.get("temperature", 1.0)),
                           float(params.get("top_p", 1.0)), int(params.get("top_k", -1)), stop, params.get("seed")),
                          int(body.get("topk_prompt_logprobs") or 0), bool(body.get("prompt_logprobs")))

    def run_samples(self, calls: list[SampleCall]) -> list[bytes]:
        """Calls with one batch key (or a single call), generated together; each answered on its own."""
        max_tokens, temperature, top_p, top_k, stop, seed = calls[0].params
        rows = self.sampler.sample(calls[0].weights, [list(c.prompt) for c in calls], [c.n for c in calls],
                                   max_tokens, temperature, top_p, top_k, None if stop is None else list(stop), seed)
        out = []
        for call, sampled in zip(calls, rows, strict=True):
            plp, topk = None, None
            if call.prompt_logprobs or call.topk > 0:
                plp, topk = self.sampler.prompt_logprobs(call.weights, list(call.prompt), call.topk)
            out.append(encode_sample([SampledSequence(r.tokens, r.logprobs, r.stopped) for r in sampled], plp, topk))
        return out

    # ---- checkpoints listing (RestClient) ------------------------------------------------------------------
    def checkpoints(self, run: str) -> list[dict]:
        out = []
        for kind, typ in (("weights", "training"), ("sampler_weights", "sampler")):
            for d in sorted((self.state_dir / run / kind).glob("*/adapter.safetensors")):
                d = d.parent
                out.append({"checkpoint_id": f"{kind}/{d.name}", "checkpoint_type": typ,
                            "time": _iso(d.stat().st_mtime), "tinker_path": f"tinker://{run}/{kind}/{d.name}",
                            "size_bytes": sum(f.stat().st_size for f in d.iterdir())})
        return out

    def training_run(self, run: str) -> dict:
        cks = self.checkpoints(run)
        if not cks and run not in self.created:
            raise Refused(f"no training run {run!r} on this server")
        spec = LoraModels.spec_of(self.state_dir / run / cks[0]["checkpoint_id"]) if cks else \
            self.models.client_spec(run)
        last = {t: [c for c in cks if c["checkpoint_type"] == t] for t in ("training", "sampler")}
        return {"training_run_id": run, "base_model": spec.base_model, "model_owner": "local", "is_lora": True,
                "lora_rank": spec.rank, "last_request_time": _iso(self.created.get(run, time.time())),
                "last_checkpoint": last["training"][-1] if last["training"] else None,
                "last_sampler_checkpoint": last["sampler"][-1] if last["sampler"] else None}


def _text_chunk(c: dict) -> list[int]:
    if c.get("type", "encoded_text") != "encoded_text":
        raise Refused(f"a {c.get('type')} chunk in the prompt; this server samples text models only")
    return list(c["tokens"])


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat()


def refused(msg: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"detail": msg}, status_code=status, headers={"x-should-retry": "false"})
