"""A transformers policy: batched, left-padded generation on CPU or GPU, returning the sampled ids
and their logprobs."""

from __future__ import annotations

from typing import Any

import torch

from sleuth.agents.models import resolve_model
from sleuth.agents.policy import Generation, Request, SamplingParams


class TransformersPolicy:
    def __init__(self, model: str = "smollm2", device: str | None = None, dtype: torch.dtype | None = None,
                 max_batch: int = 8):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = resolve_model(model)
        self.name = model
        self.version = 0
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(self.device).eval()
        self.max_batch = max_batch
        eos = self.tokenizer.eos_token_id
        self.stop_ids = [eos] if isinstance(eos, int) else list(eos)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.stop_ids[0]
        self._seeded: int | None = None
        self.max_context = int(getattr(self.model.config, "max_position_embeddings", 8192))

    @torch.inference_mode()
    def generate(self, requests: list[Request], sampling: SamplingParams) -> list[Generation]:
        out: list[Generation] = []
        for i in range(0, len(requests), self.max_batch):
            out += self._generate_batch([r.prompt_ids for r in requests[i:i + self.max_batch]], sampling)
        return out

    def _generate_batch(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):  # left padding keeps every prompt's last token aligned
            ids[row, width - len(p):] = torch.tensor(p)
            mask[row, width - len(p):] = 1
        if sampling.seed is not None and sampling.seed != self._seeded:
            torch.manual_seed(sampling.seed)  # once per seed: re-seeding every call would repeat samples
            self._seeded = sampling.seed
        greedy = sampling.temperature <= 0
        kwargs: dict[str, Any] = dict(
            max_new_tokens=sampling.max_tokens, do_sample=not greedy, eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id, return_dict_in_generate=True, output_logits=True,
        )
        if not greedy:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        res = self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), **kwargs)
        new = res.sequences[:, width:].cpu()
        # Logprob of each sampled token under the distribution it was sampled from: logits / temperature (the
        # trainer divides by the same temperature; vLLM reports the same with --logprobs-mode processed_logprobs).
        # Greedy decoding reports the raw (temperature-1) logprobs.
        # One step at a time, releasing each step's logits: stacking them all (batch × steps × vocab, then a
        # float copy and a log-softmax of it) tripled the memory HF already holds (~13 GB at 64 × 1024 tokens).
        step_logits, scale = list(res.logits), 1.0 if greedy else sampling.temperature
        del res
        lps, sampled = torch.empty(new.shape, device=self.device), new.to(self.device)
        for t in range(len(step_logits)):
            logits = step_logits[t].float() / scale
            step_logits[t] = None
            lps[:, t] = torch.log_softmax(logits, dim=-1).gather(-1, sampled[:, t:t + 1]).squeeze(-1)
        lps = lps.cpu()
        gens = []
        for row in range(len(prompts)):
            toks = new[row].tolist()
            end = next((k + 1 for k, t in enumerate(toks) if t in self.stop_ids), None)
            finish = "stop" if end is not None else "length"
            toks = toks[:end] if end is not None else toks
            gens.append(Generation(ids=toks, logprobs=lps[row, :len(toks)].tolist(),
                                   text=self.tokenizer.decode(toks, skip_special_tokens=True), finish_reason=finish))
        return gens
