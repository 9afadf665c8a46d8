"""vLLM engines as Ray rollout workers (`cluster.backend: ray` with `rollout.inference: vllm`).

Each worker is a `RolloutWorker` actor of this module (the process title is `ray::RolloutWorker`, as for the
transformers workers: one name finds every rollout worker), placed as they are (one placement-group bundle of
`cluster.worker_cpus` / `cluster.worker_gpus`; tensor parallel over the bundle's GPUs where there are several), that
starts and supervises a vLLM OpenAI server on its node with vLLM's own Python (`rollout.vllm_python`, else
$SLEUTH_VLLM_PYTHON, else .venv-vllm). The trainer sends the episodes' completions to that server directly (the
router over all workers, as for vLLM servers started locally) and the weights to the actor.

Why a supervised server and not Ray's per-actor interpreter (`runtime_env: py_executable`): an actor running in
vLLM's virtualenv needs Ray at the driver's exact version and sleuth importable beside vLLM's pinned torch and
transformers; a supervised server needs neither, and keeps vLLM's own server, scheduler and tensor-parallel
launcher as they are. The two live and die together: the server gets SIGKILL when the actor's process dies
(`PR_SET_PDEATHSIG`), and the actor exits when the server dies, so that Ray's restart of the actor is a restart of
the engine (counted in `cluster/restarts`).

Weights: the actor receives them (object store, or the collective group in buckets: `update.sync_transport`),
writes them to a file in its node's shared memory and has its server load that file (`/collective_rpc`, as
`VLLMRollout` does on one machine), resets the prefix cache and answers with the server's top-5 logprobs on the
probe prompt, which must match the trainer's within `update.sync_tolerance_vllm`. Each server serves under a name
of its own start (`policy-<nonce>`): a server restarted on the same port answers the old name's requests with an
error, never with the weights on disk. A request that fails is re-sent once the actor, restarted if it died, holds
the current weights and has been verified."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
import torch

from sleuth.agents.policies.base import Generation, Request, SamplingParams
from sleuth.agents.policies.openai_http import OpenAICompletionsPolicy, ServerError
from sleuth.core.net import free_port, wait_healthy
from sleuth.training.cluster.rollout_workers import WorkerHandle, WorkerPool
from sleuth.training.rollout.in_process import WeightSyncError
from sleuth.training.rollout.vllm_servers import servable, server_env, vllm_command
from sleuth.training.sync.weight_stream import Link, join, receive, send
from sleuth.training.zero import DIST_VARS

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # in the child, before exec: Linux delivers SIGKILL when the actor dies
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class RolloutWorker:
    """A vLLM server on this actor's node, supervised, computing in `dtype` (the trainer's: `vllm_command`)."""

    def __init__(self, python: str, model_path: str, dtype: torch.dtype, extra: list[str], gpus: float,
                 start_timeout_s: float):
        if not Path(python).exists():
            raise FileNotFoundError(f"no vLLM Python at {python} on this node: set rollout.vllm_python")
        self.served = f"policy-{uuid.uuid4().hex[:8]}"
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        cmd = vllm_command(python, model_path, port, dtype, self.served) + list(extra)
        if gpus > 1:
            cmd += ["--tensor-parallel-size", str(int(gpus))]
        if torch.cuda.is_available():  # its share of the GPU memory, as VLLMRollout's servers (a GPU may be shared)
            cmd += ["--gpu-memory-utilization", os.environ.get("SLEUTH_VLLM_GPU_MEM", "0.3")]
        env = {k: v for k, v in os.environ.items() if k not in DIST_VARS} | server_env()
        env["VLLM_CPU_KVCACHE_SPACE"] = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")
        log = Path(tempfile.gettempdir()) / f"sleuth-vllm-ray-{port}.log"
        self.proc = subprocess.Popen(cmd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,  # noqa: SIM115
                                     preexec_fn=_die_with_parent)
        try:
            wait_healthy(self.url, timeout_s=start_timeout_s, proc=self.proc)
        except (TimeoutError, RuntimeError) as e:
            self.proc.kill()
            raise RuntimeError(f"the vLLM server did not come up ({e}); its log: {log}") from None
        threading.Thread(target=self._watch, daemon=True, name="sleuth-vllm-watch").start()
        shm = Path("/dev/shm")
        self.file = Path(tempfile.mkstemp(prefix="sleuth-weights-", suffix=".safetensors",
                                          dir=shm if shm.is_dir() else None)[1])
        self.http = httpx.Client(timeout=None)
        self.weights_id = 0

    def _watch(self) -> None:
        self.proc.wait()
        with contextlib.suppress(OSError):
            self.file.unlink()
        os._exit(1)  # the engine is gone: so is this actor, and Ray restarts both

    def pid(self) -> int:
        return os.getpid()

    def info(self) -> tuple[int, str, str, int]:
        """(this process's pid, the server's URL, its served model name, the weights it holds)."""
        return os.getpid(), self.url, self.served, self.weights_id

    def load_weights(self, state: dict[str, torch.Tensor] | None, weights_id: int,
                     probe_ids: list[int]) -> tuple[int, dict[int, float] | None]:
        if state is None:
            return os.getpid(), None
        return self._serve(state, weights_id, probe_ids)

    def receive_weights(self, link: Link, rank: int, world: int, weights_id: int,
                        probe_ids: list[int]) -> tuple[int, dict[int, float]]:
        state = {s.name: torch.empty(s.shape, dtype=getattr(torch, b.dtype)) for b in link.plan for s in b.slots}
        group = join(link.address, link.port, link.prefix, rank, world, link.backend, link.timeout_s)
        try:
            receive(group, state, link.plan, torch.device("cpu"))
        finally:
            group.shutdown()
        return self._serve(state, weights_id, probe_ids)

    def send_weights(self, link: Link, world: int) -> int:
        """The weights this server holds (its node's file), as rank 0 of `link`'s group, to a restarted peer."""
        from safetensors.torch import load_file

        state = load_file(str(self.file))
        if "lm_head.weight" not in state and any(s.name == "lm_head.weight" for b in link.plan for s in b.slots):
            state["lm_head.weight"] = state["model.embed_tokens.weight"]  # tied: saved once
        group = join(link.address, link.port, link.prefix, 0, world, link.backend, link.timeout_s)
        try:
            return send(group, state, link.plan, torch.device("cpu"))
        finally:
            group.shutdown()

    def _serve(self, state: dict[str, torch.Tensor], weights_id: int, probe_ids: list[int]
               ) -> tuple[int, dict[int, float]]:
        from safetensors.torch import save_file

        save_file(servable({k: v.cpu() for k, v in state.items()}), str(self.file))
        self._post("/collective_rpc", {"method": "load_weights_from", "args": [str(self.file)]})
        self._post("/reset_prefix_cache", None)
        self.weights_id = weights_id
        return os.getpid(), self._probe(probe_ids)

    def _probe(self, probe_ids: list[int]) -> dict[int, float]:
        """The server's top-5 logprobs of the token after the probe prompt, by token id."""
        r = self._post("/v1/completions", {"model": self.served, "prompt": probe_ids, "max_tokens": 1,
                                           "temperature": 0, "logprobs": 5, "return_tokens_as_token_ids": True})
        top = r["choices"][0]["logprobs"]["top_logprobs"][0]
        return {int(t.split(":", 1)[1]): float(lp) for t, lp in top.items()}

    def _post(self, path: str, body: Any) -> Any:
        resp = self.http.post(self.url + path, **({"json": body} if body is not None else {}))
        if resp.status_code != 200:
            raise WeightSyncError(f"vLLM {path} answered {resp.status_code}: {resp.text[:300]}")
        return resp.json() if resp.content else None


class VLLMHandle(WorkerHandle):
    """One vLLM worker as the router sees a server: completions go to its server; a failed request is sent again
    once the actor (restarted, if it died) holds the current weights and they are verified."""

    server: OpenAICompletionsPolicy | None = None

    def started(self) -> None:
        self._connect(*self.owner.ray.get(self.actor.info.remote())[1:3])

    def _connect(self, url: str, served: str) -> None:
        if self.server is not None and self.server.base_url == url and self.server.model == served:
            return
        self.server = OpenAICompletionsPolicy(url, served, self.tokenizer, concurrency=self.owner.max_batch,
                                              name=f"{self.name}@{url}", send_seed=torch.cuda.is_available(),
                                              max_context=self.max_context)
        self.parallel_calls = self.server.parallel_calls

    def generate(self, requests: list[Request], sampling: SamplingParams) -> list[Generation]:
        for _ in range(self.attempts):
            if self.dead:
                break
            epoch, server = self.epoch, self.server
            try:
                return server.generate(requests, sampling)
            except ServerError:
                if not self._replaced(server):
                    raise  # the engine's own answer (not a restart): the episode fails as an engine failure
                self.recover(epoch)
        raise self.unreachable()

    def _replaced(self, server: OpenAICompletionsPolicy) -> bool:
        """Whether the worker behind `server` is not the one it was: restarted, dying, or moved on."""
        from ray.exceptions import RayError

        try:
            pid, url, served, held = self.owner.ray.get(self.actor.info.remote(), timeout=self.owner.timeout_s)
        except RayError:
            return True
        return pid != self.pid or (url, served) != (server.base_url, server.model) or held != self.owner.weights_id

    def loaded(self, pid: int, top: Any) -> float:
        diff = super().loaded(pid, top)
        if self.dead:  # stopped: crash-looping
            return diff
        self._connect(*self.owner.ray.get(self.actor.info.remote())[1:3])
        return diff


class VLLMPool(WorkerPool):
    """`cluster.rollout_workers` vLLM RolloutWorkers; syncs verified on the top-5 probe logprobs (`tolerance`)."""

    diff_metric = "sync/max_logprob_diff"

    def __init__(self, *args: Any, python: str, vllm_args: list[str], **kwargs: Any):
        self.python, self.vllm_args = python, vllm_args
        super().__init__(*args, **kwargs)

    def worker(self) -> tuple[type, tuple[Any, ...]]:
        return RolloutWorker, (self.python, self.model_path, self.dtype, self.vllm_args, self.cluster.worker_gpus,
                               self.timeout_s)

    def handle(self, index: int, actor: Any) -> WorkerHandle:
        return VLLMHandle(self, index, actor)

    def verify(self, handle: WorkerHandle, top: dict[int, float] | None) -> float:
        if self.expected is None or top is None:
            return 0.0
        ours = torch.log_softmax(self.expected.float(), -1)
        diff = max(abs(lp - float(ours[t])) for t, lp in top.items())
        if not diff <= self.tolerance:
            raise WeightSyncError(f"after sync the probe logprobs of {handle.name} differ from the trainer's by "
                                  f"{diff:.3g} (> {self.tolerance}): the engine is not running the new weights")
        return diff
