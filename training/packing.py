"""Attention for packed rows that costs what the sequences cost, not what the row costs.

transformers runs a packed row (position ids restarting at 0 for each sequence, no attention mask) under
SDPA with a block-diagonal causal mask: correct, but the kernel computes all N² query–key pairs of the
row, and a mask keeps SDPA off its fastest causal kernels. Measured on one update of SmolLM2 on 2 CPU
cores that made a packed micro-batch 1.55× slower than the padded one. Flash-attention's variable-length
kernels avoid this on a GPU; on other devices `segment_attention` does the same by hand: one causal SDPA
call per sequence of the row (Σ Lᵢ² pairs, no mask) and the outputs concatenated. Rows that are not packed
(a padded batch, with its mask) go to transformers' own SDPA unchanged.
"""

from __future__ import annotations

import torch

NAME = "sleuth_segments"


def segments(position_ids: torch.Tensor) -> list[tuple[int, int]]:
    """[start, end) of each sequence in a packed row, from its position ids (each sequence starts at 0)."""
    starts = (position_ids == 0).nonzero().flatten().tolist()
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    return list(zip(starts, [*starts[1:], len(position_ids)], strict=True))


def segment_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      position_ids: torch.Tensor | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function protocol: query/key/value (B, heads, L, D) → output (B, L, heads, D)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    spans = segments(position_ids[0]) if position_ids is not None and query.shape[0] == 1 else []
    if len(spans) < 2 or query.shape[2] != key.shape[2]:  # not a packed row (or a cached decode): plain SDPA
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    outs = [sdpa_attention_forward(module, query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], None,
                                   dropout=dropout, scaling=scaling, is_causal=True)[0] for a, b in spans]
    return torch.cat(outs, dim=1), None


def use_segment_attention(model: torch.nn.Module) -> bool:
    """Switch a transformers model that runs SDPA to `segment_attention` (registered once); models on
    flash-attention (variable-length already) or eager keep theirs. Returns whether it switched."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if model.config._attn_implementation != "sdpa":
        return False
    if NAME not in AttentionInterface():
        AttentionInterface.register(NAME, segment_attention)
        AttentionMaskInterface.register(NAME, sdpa_mask)  # padded batches still get SDPA's own mask
    model.set_attn_implementation(NAME)
    return True
