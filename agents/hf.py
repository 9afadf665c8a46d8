"""A transformers policy: batched, left-padded generation on CPU or GPU, returning the sampled ids
and their logprobs."""

from __future__ import annotations

from typing import Any

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from sleuth.agents.models import resolve_model
from sleuth.agents.policy import Generation, Request, SamplingParams


class _SampledLogprobs(LogitsProcessor):
    """Records the logprob of each sampled token under logits / temperature (what the trainer recomputes;
    vLLM reports the same with --logprobs-mode processed_logprobs; greedy: temperature 1), one step at a
    time: at step t the new token of step t-1 is the last column of `input_ids`. Asking generate for
    `output_logits` instead keeps every step's full-vocabulary logits (~13 GB in fp32 at batch 64 × 1024
    tokens). Custom processors run after generate's own (penalties, if the model's generation config sets
    any) and before temperature and top-p."""

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.pending: torch.Tensor | None = None  # log-softmax of the last step, waiting for its token
        self.steps: list[torch.Tensor] = []

    def _take(self, tokens: torch.Tensor) -> None:
        if self.pending is not None:
            self.steps.append(self.pending.gather(-1, tokens[:, None])[:, 0])

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._take(input_ids[:, -1])
        self.pending = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """(batch, steps) logprobs, once generate has returned the last step's tokens."""
        self._take(last_tokens)
        self.pending = None
        return torch.stack(self.steps, dim=1) if self.steps else torch.empty(len(last_tokens), 0)


class TransformersPolicy:
    def __init__(self, model: str = "smollm2", device: str | None = None, dtype: torch.dtype | None = None,
                 max_batch: int = 8, share_prefill: bool = True):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = resolve_model(model)
        self.name = model
        self.version = 0
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(self.device).eval()
        self.max_batch = max_batch
        # A GRPO group's members start from the same prompt: prefill it once and copy its KV cache to each
        # member (the prefill is most of a DocRead turn's cost: ~1,000 prompt tokens for 48 generated).
        self.share_prefill = share_prefill
        self.parallel_calls = 1  # one model, one call at a time: ready requests are batched into the next call
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
        recorder = _SampledLogprobs(1.0 if greedy else sampling.temperature)
        kwargs: dict[str, Any] = dict(
            max_new_tokens=sampling.max_tokens, do_sample=not greedy, eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id, logits_processor=LogitsProcessorList([recorder]),
        )
        if self.share_prefill:
            cache = self._shared_prefill(prompts, ids, mask)
            if cache is not None:
                kwargs["cache"] = cache
        if not greedy:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        sequences = self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), **kwargs)
        new = sequences[:, width:].cpu()
        lps = recorder.finish(sequences[:, -1]).cpu()
        gens = []
        for row in range(len(prompts)):
            toks = new[row].tolist()
            end = next((k + 1 for k, t in enumerate(toks) if t in self.stop_ids), None)
            finish = "stop" if end is not None else "length"
            toks = toks[:end] if end is not None else toks
            gens.append(Generation(ids=toks, logprobs=lps[row, :len(toks)].tolist(),
                                   text=self.tokenizer.decode(toks, skip_special_tokens=True), finish_reason=finish))
        return gens

    def _shared_prefill(self, prompts: list[list[int]], ids: torch.Tensor, mask: torch.Tensor) -> Any:
        """A KV cache of every row but its last token, computed once per distinct prompt and copied to the
        rows that share it (generate then prefills only the last token); None when no prompt repeats. The
        positions are generate's own for left padding (cumsum of the mask), so the cache is the one
        generate would have built."""
        from transformers import DynamicCache

        first: dict[tuple[int, ...], int] = {}
        rows = [first.setdefault(tuple(p), i) for i, p in enumerate(prompts)]
        distinct = sorted(set(rows))
        if len(distinct) == len(prompts) or ids.shape[1] < 2:
            return None
        u_ids, u_mask = ids[distinct, :-1].to(self.device), mask[distinct, :-1].to(self.device)
        positions = (u_mask.cumsum(-1) - 1).masked_fill(u_mask == 0, 0)
        cache = DynamicCache(config=self.model.config)
        self.model(input_ids=u_ids, attention_mask=u_mask, position_ids=positions, cache=cache, use_cache=True,
                   logits_to_keep=1)
        where = {r: k for k, r in enumerate(distinct)}
        cache.batch_select_indices(torch.tensor([where[r] for r in rows], device=self.device))
        return cache

