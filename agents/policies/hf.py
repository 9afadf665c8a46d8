"""A transformers policy: batched, left-padded generation on CPU or GPU, returning the sampled ids
and their logprobs."""

from __future__ import annotations

from numbers import Integral
from typing import Any

import numpy as np
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from sleuth.agents.policies.base import Generation, Request, SamplingParams
from sleuth.agents.policies.models import load_causal_lm, resolve_model
from sleuth.agents.policies.prefix_kv import PrefixEntry, PrefixHit, PrefixKVStore


class TokenSampler(LogitsProcessor):
    """Picks each step's token itself and records its logprob under logits / temperature (what the trainer
    recomputes; vLLM reports the same with --logprobs-mode processed_logprobs; greedy: temperature 1); generate
    runs greedy and takes the one token left. At step t the token of step t-1 is the last column of
    `input_ids`. Asking generate for `output_logits` instead keeps every step's full-vocabulary logits
    (~13 GB in fp32 at batch 64 × 1024 tokens).

    It samples by inverse CDF — one uniform draw per row against the cumulative probabilities — not with
    generate's `torch.multinomial`, which draws an exponential per vocabulary entry: 49,152 a row, 16.7 ms of
    a 100 ms decode step of SmolLM2 at 16 rows on 2 CPU cores. Top-k then top-p as transformers' warpers do
    (top-p keeps the most likely tokens whose mass reaches p, at least one). Custom processors run after
    generate's own (penalties, if the model's generation config sets any)."""

    def __init__(self, temperature: float, top_p: float = 1.0, top_k: int = 0):
        self.sample = temperature > 0
        self.temperature = temperature if self.sample else 1.0
        self.top_p, self.top_k = top_p, top_k
        self.pending: torch.Tensor | None = None  # log-softmax of the last step, waiting for its token
        self.steps: list[torch.Tensor] = []

    def _take(self, tokens: torch.Tensor) -> None:
        if self.pending is not None:
            self.steps.append(self.pending.gather(-1, tokens[:, None])[:, 0])

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._take(input_ids[:, -1])
        self.pending = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        if not self.sample:
            return scores
        token = sample_inverse_cdf(self.pending.exp(), self.top_p, self.top_k)
        return torch.full_like(scores, float("-inf")).scatter_(1, token[:, None], 0.0)

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """(batch, steps) logprobs, once generate has returned the last step's tokens."""
        self._take(last_tokens)
        self.pending = None
        return torch.stack(self.steps, dim=1) if self.steps else torch.empty(len(last_tokens), 0)


def sample_inverse_cdf(probs: torch.Tensor, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """One token per row of (batch, vocab) probabilities, after top-k and top-p, from the global torch RNG:
    row r takes the first token whose cumulative probability passes u·total, u uniform in [0, 1). A token of
    probability 0 spans an empty interval and is never taken. The sums are float64 (49k fp32 terms would
    carry ~1e-5 of rounding)."""
    if 0 < top_k < probs.shape[-1]:
        kth = probs.topk(top_k, dim=-1).values[:, -1:]
        probs = probs.masked_fill(probs < kth, 0.0)
    if top_p < 1.0:
        ascending, order = probs.sort(dim=-1)
        mass = ascending.double().cumsum(-1)
        drop = mass <= (1.0 - top_p) * mass[:, -1:]
        drop[:, -1] = False
        probs = probs.masked_fill(torch.zeros_like(drop).scatter(1, order, drop), 0.0)
    cdf = probs.double().cumsum(-1)
    total = cdf[:, -1:]
    u = torch.rand(total.shape, dtype=torch.float64, device=probs.device) * total
    token = torch.searchsorted(cdf, torch.minimum(u, torch.nextafter(total, torch.zeros_like(total))), right=True)
    return token[:, 0]


class TransformersPolicy:
    """`model`'s weights loaded here, or `module`: a model already in memory (the trainer's own, on `device`),
    run as it is, so that one process holds one copy of the weights."""

    def __init__(self, model: str = "smollm2", device: str | None = None, dtype: torch.dtype | None = None,
                 max_batch: int = 8, kv_keep_mb: int = 1024,
                 module: torch.nn.Module | None = None):
        from transformers import AutoTokenizer, DynamicCache
        from transformers.cache_utils import DynamicLayer

        path = resolve_model(model)
        self.name = model
        self.version = 0
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = module if module is not None else load_causal_lm(path, dtype).to(self.device).eval()
        self.max_batch = max_batch
        # The prefill is most of a turn's cost on a CPU (SmolLM2, 2 cores: 16 rows × 1,000 prompt tokens take
        # 64 s, 48 decode steps of those rows 7 s). A GRPO group's members start from the same prompt: it is
        # prefilled once and its KV cache copied to each member.
        # An episode's next prompt starts with its last prompt and generation: their KV states are kept
        # (up to `kv_keep_mb` MB, per weights version) and only the new tokens are prefilled. Only for
        # models whose cache is plain full attention; 0 turns it off.
        plain = all(type(layer) is DynamicLayer for layer in DynamicCache(config=self.model.config).layers)
        self.prefixes = PrefixKVStore(kv_keep_mb << 20) if kv_keep_mb > 0 and plain else None
        self.parallel_calls = 1  # one model, one call at a time: ready requests are batched into the next call
        eos = self.tokenizer.eos_token_id
        self.stop_ids = [eos] if isinstance(eos, int) else list(eos)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.stop_ids[0]
        self._seeded: int | None = None
        self.max_context = int(getattr(self.model.config, "max_position_embeddings", 8192))

    # no_grad, not inference_mode: the module may be the trainer's, and a buffer a forward rewrites under
    # inference_mode (a dynamic RoPE's inv_freq) could never be saved for a backward afterwards
    @torch.no_grad()
    def generate(self, requests: list[Request], sampling: SamplingParams) -> list[Generation]:
        for i, r in enumerate(requests):
            if not r.prompt_ids or not all(isinstance(t, Integral) for t in r.prompt_ids):
                raise ValueError(f"request {i}: prompt_ids must be a non-empty list of token ids (ints), got "
                                 f"{str(r.prompt_ids)[:80]} (a tokenizer's BatchEncoding? take its input_ids)")
        out: list[Generation] = []
        for i in range(0, len(requests), self.max_batch):
            out += self._generate_batch([r.prompt_ids for r in requests[i:i + self.max_batch]], sampling)
        return out

    def _generate_batch(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]:
        if sampling.seed is not None and sampling.seed != self._seeded:
            torch.manual_seed(sampling.seed)  # once per seed: re-seeding every call would repeat samples
            self._seeded = sampling.seed
        ids, mask, cache, hits = self._prefill(prompts)
        width = ids.shape[1]
        recorder = TokenSampler(sampling.temperature, sampling.top_p)
        kwargs: dict[str, Any] = dict(
            max_new_tokens=sampling.max_tokens, do_sample=False, eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id, logits_processor=LogitsProcessorList([recorder]),
        )
        if cache is not None:
            kwargs["cache"] = cache
        sequences = self.model.generate(input_ids=ids, attention_mask=mask, **kwargs)
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
        if self.prefixes is not None and cache is not None:
            self._keep(prompts, gens, mask, cache, hits)
        return gens

    def _prefill(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, Any, list[PrefixHit]]:
        """Left-padded ids and mask for generate and, when something is reused, a KV cache of every column
        but the last (generate then runs only the last): each distinct prompt's kept prefix is copied in and
        the rest prefilled once, then the cache is copied to the rows that share the prompt.

        Row layout: [pad] [kept prefix] [pad] [rest of the prompt], so that every row's kept states fill the
        same cache columns and its last token is the last column. The holes are masked, and the positions
        are generate's own (cumsum of the mask), those the kept states were computed at."""
        from transformers import DynamicCache

        first: dict[tuple[int, ...], int] = {}
        rows = [first.setdefault(tuple(p), i) for i, p in enumerate(prompts)]
        distinct = sorted(set(rows))
        hits = {d: self.prefixes.lookup(prompts[d], self.version) if self.prefixes is not None else PrefixHit(None, 0)
                for d in distinct}
        if all(h.entry is None for h in hits.values()) and (len(distinct) == len(prompts) or
                                                             max(map(len, prompts)) < 2):
            # Nothing to reuse: generate builds its own cache (a fresh one it fills, when its states are kept).
            ids, mask = self._layout(prompts, [0] * len(prompts))
            fresh = DynamicCache(config=self.model.config) if self.prefixes is not None else None
            return ids, mask, fresh, [PrefixHit(None, 0)] * len(prompts)
        ids, mask = self._layout([prompts[d] for d in distinct], [hits[d].length for d in distinct])
        kept = max(h.length for h in hits.values())
        rest = ids.shape[1] - kept
        cache = DynamicCache(config=self.model.config)
        if kept:
            ref = next(h.entry for h in hits.values() if h.entry is not None)
            for layer in range(len(cache.layers)):
                heads, dim = ref.keys[layer].shape[0], ref.keys[layer].shape[-1]
                keys = torch.zeros((len(distinct), heads, kept, dim), dtype=ref.keys[layer].dtype, device=self.device)
                values = torch.zeros_like(keys)
                for k, d in enumerate(distinct):
                    if (n := hits[d].length):
                        keys[k, :, kept - n:] = hits[d].entry.keys[layer][:, :n]
                        values[k, :, kept - n:] = hits[d].entry.values[layer][:, :n]
                cache.update(keys, values, layer)
        if rest > 1:
            cols = slice(kept, kept + rest - 1)
            positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
            self.model(input_ids=ids[:, cols], attention_mask=mask[:, :kept + rest - 1],
                       position_ids=positions[:, cols], cache=cache, use_cache=True, logits_to_keep=1)
        if len(distinct) < len(prompts):
            where = {d: k for k, d in enumerate(distinct)}
            index = torch.tensor([where[d] for d in rows], device=self.device)
            cache.batch_select_indices(index)
            ids, mask = ids[index], mask[index]
        return ids, mask, cache, [hits[d] for d in rows]

    def _layout(self, prompts: list[list[int]], kept: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Row k: [pad] prompt[:kept[k]] [pad] prompt[kept[k]:], the kept prefixes ending in one column and
        the prompts in the last one."""
        front = max(kept)
        back = max(len(p) - n for p, n in zip(prompts, kept, strict=True))
        ids = torch.full((len(prompts), front + back), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for k, (p, n) in enumerate(zip(prompts, kept, strict=True)):
            ids[k, front - n:front] = torch.tensor(p[:n], dtype=torch.long)
            ids[k, front + back - (len(p) - n):] = torch.tensor(p[n:])
            mask[k, front - n:front], mask[k, front + back - (len(p) - n):] = 1, 1
        return ids.to(self.device), mask.to(self.device)

    def _keep(self, prompts: list[list[int]], gens: list[Generation], mask: torch.Tensor, cache: Any,
              hits: list[PrefixHit]) -> None:
        """Keep each row's states for its prompt and all but its last generated token (the last one may
        never have been fed to the model)."""
        width = mask.shape[1]
        for row, (prompt, gen) in enumerate(zip(prompts, gens, strict=True)):
            if not gen.ids:
                continue
            cols = torch.cat([mask[row].nonzero()[:, 0],
                              torch.arange(width, width + len(gen.ids) - 1, device=mask.device)])
            entry = PrefixEntry(np.asarray(prompt + gen.ids[:-1]),
                                [layer.keys[row].index_select(1, cols) for layer in cache.layers],
                                [layer.values[row].index_select(1, cols) for layer in cache.layers])
            self.prefixes.put(entry, self.version, replaces=hits[row].entry)
