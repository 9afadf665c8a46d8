"""The forward pass the losses need: logits only at the positions that predict a scored token.

A causal LM's forward materialises (B, L, V) logits; the loss reads the n ≪ B·L positions that predict a
policy token (the loss mask). On a multi-turn DocRead batch most positions are documents and prompts, and
with SmolLM2's 49k vocabulary the head is a fifth of the forward FLOPs and the largest activation. So the
model runs with `logits_to_keep=1` (transformers' own switch: the head on the last position only) and the
head is applied to the selected last hidden states: (n, H) → (n, V), then divided by the temperature, a
chunk of positions at a time (`Scored.logprobs`; chunks recomputed in backward where there are several).

Models whose forward does more than `lm_head(last hidden state)` (logit soft-capping, scaling) would give
other numbers; the first call compares both paths on a short input and keeps the full-logits path where
they differ, so the result is the model's own logits either way.

`packed=True` runs the model on the real tokens only: the right-padded rows are concatenated into one
row, with position ids restarting at 0 for each sequence and no attention mask, which transformers reads
as packed sequences (attention confined to each one: variable-length kernels for flash-attention, one
causal SDPA call per sequence for a model on SDPA (`training/rl/packing.py`), a block-diagonal mask for
eager). The hidden states are scattered back to the padded grid, so what the losses and a mixing head
see is the padded path's, without padding's compute. A model that does not confine attention this way is
caught before the first batch (packed and padded compared on two short rows) and runs padded, with a
warning. On a model switched to segment attention, sequences that begin alike share their common prefix
in the row (`packing.layout`; `share_prefix`): a GRPO group's prompt runs once, not once per member.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from sleuth.training.rl.losses import chunked_logprobs, scored_logprobs
from sleuth.training.rl.packing import layout, use_segment_attention


@dataclass
class Scored:
    """What the losses read at the n positions that predict a masked token: log-probabilities and entropies
    (`logprobs`, the head applied `chunk` positions at a time), or the (n, V) fp32 `logits` / temperature."""

    hidden: torch.Tensor  # (B, L, H): the last hidden state (what a mixing head reads)
    temperature: float
    head: Callable[[torch.Tensor], torch.Tensor]
    selected: torch.Tensor | None = None  # (n, H): the last hidden states there, where logits = head(them)
    full: torch.Tensor | None = None  # (n, V): the model's own logits there, where they are not head(hidden)
    chunk: int = 1024

    @property
    def logits(self) -> torch.Tensor:
        return (self.head(self.selected) if self.full is None else self.full).float() / self.temperature

    def logprobs(self, input_ids: torch.Tensor, mask: torch.Tensor,
                 with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, L) log-probability (and entropy) of each masked token, 0 off the mask."""
        if self.full is not None:
            return scored_logprobs(self.logits, input_ids, mask, with_entropy)
        return chunked_logprobs(self.selected, self.head, self.temperature, input_ids, mask, with_entropy, self.chunk)

    def logprobs_at(self, index: torch.Tensor) -> torch.Tensor:
        """(n, k) log-probabilities of the ids `index` (n, k) at the n scored positions (a distillation loss reads
        the student at the teacher's top-k ids), `chunk` positions at a time, each chunk recomputed in the
        backward pass where several need gradients."""
        def part(rows: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
            logits = rows.float() / self.temperature if self.full is not None else \
                self.head(rows).float() / self.temperature
            return torch.log_softmax(logits, dim=-1).gather(-1, idx)

        rows = self.full if self.full is not None else self.selected
        recompute = torch.is_grad_enabled() and rows.requires_grad and rows.shape[0] > self.chunk
        spans = [slice(i, i + self.chunk) for i in range(0, rows.shape[0], self.chunk)]
        parts = [checkpoint(part, rows[s], index[s], use_reentrant=False) if recompute else part(rows[s], index[s])
                 for s in spans]
        return torch.cat(parts) if parts else index.new_zeros(index.shape, dtype=torch.float32)

    @torch.no_grad()
    def topk(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, log-probabilities), each (n, k): the k likeliest ids at each of the n scored positions."""
        rows = self.full if self.full is not None else self.selected
        ids, lps = [], []
        for i in range(0, rows.shape[0], self.chunk):
            chunk = rows[i:i + self.chunk]
            logits = chunk.float() if self.full is not None else self.head(chunk).float()
            top = torch.log_softmax(logits / self.temperature, dim=-1).topk(k, dim=-1)
            ids.append(top.indices)
            lps.append(top.values)
        if not ids:
            return torch.zeros((0, k), dtype=torch.long), torch.zeros((0, k))
        return torch.cat(ids), torch.cat(lps)


def causal_lm(module: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a peft wrapper (its head is the base model's)."""
    from peft import PeftModel

    return module.get_base_model() if isinstance(module, PeftModel) else module


class ScoredForward:
    """`model(ids, attention, mask) -> Scored`, for a callable model (a module or a DeepSpeed engine) and
    the module it wraps; `attention` marks real tokens of right-padded rows."""

    def __init__(self, model: Callable[..., Any], module: torch.nn.Module, temperature: float = 1.0,
                 packed: bool = False, chunk: int = 1024, share_prefix: bool = True):
        if chunk < 1:
            raise ValueError(f"the logit chunk must be ≥ 1 position, got {chunk}")
        self.model, self.temperature, self.packed, self.chunk = model, temperature, packed, chunk
        self.head = causal_lm(module).get_output_embeddings()
        # one causal SDPA call per packed sequence instead of a masked one over the whole row; only then can
        # the row also share prefixes (the blocks are that attention's)
        self.segmented = packed and use_segment_attention(causal_lm(module))
        self.share_prefix = share_prefix and self.segmented
        self.selective: bool | None = None  # whether lm_head(hidden) is the model's logits: asked once
        self._confined: bool | None = None  # whether packing works for this model: asked once, if packed

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, mask: torch.Tensor) -> Scored:
        sel = mask[:, 1:].bool()
        if self.uses_packing() and len(input_ids) > 1:
            hidden = self._packed_hidden(input_ids, attention_mask)
        elif self.head_is_the_logits():
            hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True,
                                logits_to_keep=1).hidden_states[-1]
        else:
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
            return Scored(out.hidden_states[-1], self.temperature, self.head, full=out.logits[:, :-1][sel])
        return Scored(hidden, self.temperature, self.head, selected=hidden[:, :-1][sel], chunk=self.chunk)

    def uses_packing(self) -> bool:
        """Whether micro-batches run packed: asked for, the head is the model's logits and the model confines
        attention to each sequence."""
        if self.packed and self._confined is None and self.head_is_the_logits():
            self._confined = self._packing_confines_attention()
        return bool(self.packed and self.head_is_the_logits() and self._confined)

    def shares_prefix(self) -> bool:
        """Whether packed rows lay a common prefix out once (what `micro_batches(share=...)` must count)."""
        return self.share_prefix and self.uses_packing()

    def head_is_the_logits(self) -> bool:
        if self.selective is None:
            self.selective = self._head_matches_logits()
        return self.selective

    def _packed_hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The last hidden states of the real tokens, run as one packed row, on the padded (B, L, H) grid."""
        real = attention_mask.bool()
        row = layout([ids[m].tolist() for ids, m in zip(input_ids, real, strict=True)], share=self.share_prefix)
        extra = {"sleuth_blocks": row.blocks} if self.segmented else {}
        out = self.model(input_ids=torch.tensor(row.ids, device=input_ids.device)[None],
                         position_ids=torch.tensor(row.positions, device=input_ids.device)[None], use_cache=False,
                         output_hidden_states=True, logits_to_keep=1, **extra)
        packed = out.hidden_states[-1][0]
        hidden = packed.new_zeros((*input_ids.shape, packed.shape[-1]))
        # a shared prefix is gathered into every member's row: its gradient is the sum over the members
        hidden[real] = packed[torch.tensor([i for s in row.sources for i in s], device=packed.device)]
        return hidden

    @torch.no_grad()
    def _head_matches_logits(self) -> bool:
        ids = torch.arange(1, 9, device=self.head.weight.device)[None]
        out = self.model(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True)
        mine = self.head(out.hidden_states[-1]).float()
        return bool(torch.allclose(mine, out.logits.float(), rtol=1e-4, atol=1e-4))

    @torch.no_grad()
    def _packing_confines_attention(self) -> bool:
        """Three short sequences give the same hidden states packed as padded: attention does not cross from
        one into another, and where two share a prefix (laid out once) each still sees its own tokens."""
        ids = torch.arange(1, 25, device=self.head.weight.device).repeat(3, 1)
        ids[1, 18:] += 30  # shares its first 18 tokens with the first row
        ids[2] += 60  # shares nothing, and is padded
        attention = torch.ones_like(ids)
        attention[2, 9:] = 0
        padded = self.model(input_ids=ids, attention_mask=attention, output_hidden_states=True,
                            logits_to_keep=1).hidden_states[-1]
        packed = self._packed_hidden(ids, attention)
        real = attention.bool()
        a, b = packed[real].float(), padded[real].float()
        # per token, |packed − padded| / |padded|: SmolLM2 3e-5 in fp32, 0.016 in bf16 (its kernels round the
        # two layouts apart); attending across sequences moves it by ~2
        rel = float(((a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-6)).max())
        same = rel <= (1e-3 if padded.dtype == torch.float32 else 0.1)
        if not same:
            warnings.warn("this model attends across packed sequences (position ids and no attention mask are "
                          "not read as packing): update.packing is off for it, micro-batches run padded",
                          stacklevel=3)
        return same
