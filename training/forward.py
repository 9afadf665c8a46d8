"""The forward pass the losses need: logits only at the positions that predict a scored token.

A causal LM's forward materialises (B, L, V) logits; the loss reads the n ≪ B·L positions that predict a
policy token (the loss mask). On a multi-turn DocRead batch most positions are documents and prompts, and
with SmolLM2's 49k vocabulary the head is a fifth of the forward FLOPs and the largest activation. So the
model runs with `logits_to_keep=1` (transformers' own switch: the head on the last position only) and the
head is applied to the selected last hidden states: (n, H) → (n, V), then divided by the temperature.

Models whose forward does more than `lm_head(last hidden state)` (logit soft-capping, scaling) would give
other numbers; the first call compares both paths on a short input and keeps the full-logits path where
they differ, so the result is the model's own logits either way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Scored:
    logits: torch.Tensor  # (n, V): logits / temperature at the n positions that predict a masked token
    hidden: torch.Tensor  # (B, L, H): the last hidden state (what a mixing head reads)


def causal_lm(module: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a peft wrapper (its head is the base model's)."""
    from peft import PeftModel

    return module.get_base_model() if isinstance(module, PeftModel) else module


class ScoredForward:
    """`model(ids, attention, mask) -> Scored`, for a callable model (a module or a DeepSpeed engine) and
    the module it wraps."""

    def __init__(self, model: Callable[..., Any], module: torch.nn.Module, temperature: float = 1.0):
        self.model, self.temperature = model, temperature
        self.head = causal_lm(module).get_output_embeddings()
        self.selective: bool | None = None  # decided on the first call

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, mask: torch.Tensor) -> Scored:
        if self.selective is None:
            self.selective = self._head_is_the_logits(input_ids[:1, :8], attention_mask[:1, :8])
        sel = mask[:, 1:].bool()
        if self.selective:
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True,
                             logits_to_keep=1)
            hidden = out.hidden_states[-1]
            logits = self.head(hidden[:, :-1][sel])
        else:
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
            hidden, logits = out.hidden_states[-1], out.logits[:, :-1][sel]
        return Scored(logits / self.temperature, hidden)

    @torch.no_grad()
    def _head_is_the_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> bool:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        mine = self.head(out.hidden_states[-1]).float()
        return bool(torch.allclose(mine, out.logits.float(), rtol=1e-4, atol=1e-4))
