"""Attention for packed rows that costs what the sequences cost, not what the row costs.

transformers runs a packed row (position ids restarting at 0 for each sequence, no attention mask) under
SDPA with a block-diagonal causal mask: correct, but the kernel computes all N² query–key pairs of the
row, and a mask keeps SDPA off its fastest causal kernels. Measured on one update of SmolLM2 on 2 CPU
cores that made a packed micro-batch 1.55× slower than the padded one. Flash-attention's variable-length
kernels avoid this on a GPU; on other devices `segment_attention` does the same by hand: one causal SDPA
call per sequence of the row (Σ Lᵢ² pairs, no mask) and the outputs concatenated. Rows that are not packed
(a padded batch, with its mask) go to transformers' own SDPA unchanged.

Sequences of one micro-batch that begin alike (a GRPO group's members share their prompt) are laid out
with the common prefix once (`layout`): the prefix runs causally, and each member's own tokens attend to
the prefix and, causally, to themselves, at the positions they have in the member (prefix length on).
Under causal attention a prefix's states depend only on its tokens, so every member's hidden states (and,
since the gathered prefix sums the gradient of each member, every parameter gradient) are those of its
own full sequence, for the prefix's compute paid once instead of once per member. Prefixes nest: members
that share more than the group's prompt (branches of one episode) lay that part out once inside it, and
their own tokens attend to every prefix span on their path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from sleuth.agents.policies.prefix_kv import common_prefix

NAME = "sleuth_segments"
# Below this many common tokens a shared prefix saves less than the extra attention call it costs.
MIN_SHARED = 16


@dataclass(frozen=True)
class Layout:
    """A packed row: its token ids and position ids, its attention blocks (queries [qa, qb) attend to each
    prefix span [pa, pb) of `spans`, all of it, and to themselves causally; no spans: no prefix), and for
    each input sequence the row index of each of its tokens."""

    ids: list[int]
    positions: list[int]
    blocks: tuple[tuple[int, int, tuple[tuple[int, int], ...]], ...]
    sources: list[list[int]]

    @property
    def tokens(self) -> int:
        return len(self.ids)


def layout(seqs: Sequence[Sequence[int]], share: bool = True) -> Layout:
    """Lay sequences out in one row; with `share`, as a prefix tree: each sequence joins the earlier cluster
    with which it has the longest common prefix (≥ MIN_SHARED tokens, the cluster's prefix shrinking to it),
    each cluster's prefix is laid out once, and its members are laid out the same way after it. A GRPO
    group shares its prompt; branches of one episode (`branches.answer`) share the whole episode up to the
    turn they branch at, inside the group's prompt."""
    arrays = [np.asarray(s) for s in seqs]
    ids: list[int] = []
    positions: list[int] = []
    blocks: list[tuple[int, int, tuple[tuple[int, int], ...]]] = []
    sources: list[list[int]] = [[] for _ in seqs]

    def lay(tokens: np.ndarray, first_position: int, spans: tuple[tuple[int, int], ...]) -> list[int]:
        start = len(ids)
        ids.extend(tokens.tolist())
        positions.extend(range(first_position, first_position + len(tokens)))
        if len(tokens):
            blocks.append((start, len(ids), spans))
        return list(range(start, len(ids)))

    def place(members: list[int], depth: int, spans: tuple[tuple[int, int], ...]) -> None:
        """Lay out `members`, which share their first `depth` tokens (already laid out: `spans`)."""
        clusters: list[tuple[int, list[int]]] = []  # (common length past depth, members)
        for i in members:
            best, shared = -1, 0
            for c, (common, held) in enumerate(clusters if share else []):
                n = min(common, common_prefix(arrays[held[0]][depth:], arrays[i][depth:]))
                if n > shared:
                    best, shared = c, n
            if shared >= MIN_SHARED:
                clusters[best] = (shared, [*clusters[best][1], i])
            else:
                clusters.append((len(arrays[i]) - depth, [i]))
        for common, held in clusters:
            if len(held) == 1:
                sources[held[0]] += lay(arrays[held[0]][depth:], depth, spans)
                continue
            laid = lay(arrays[held[0]][depth:depth + common], depth, spans)
            for m in held:
                sources[m] += laid
            place(held, depth + common, (*spans, (laid[0], laid[-1] + 1)))

    place(list(range(len(arrays))), 0, ())
    return Layout(ids, positions, tuple(blocks), sources)


def segments(position_ids: torch.Tensor) -> list[tuple[int, int]]:
    """[start, end) of each sequence in a packed row, from its position ids (each sequence starts at 0)."""
    starts = (position_ids == 0).nonzero().flatten().tolist()
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    return list(zip(starts, [*starts[1:], len(position_ids)], strict=True))


def segment_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      position_ids: torch.Tensor | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function protocol: query/key/value (B, heads, L, D) → output (B, L, heads, D).
    A `Layout`'s blocks come as the `sleuth_blocks` keyword; without them a packed row's sequences are read
    from its position ids."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    blocks = kwargs.pop("sleuth_blocks", None)
    if blocks is not None and query.shape[0] == 1 and query.shape[2] == key.shape[2]:
        q, k, v = (_pieces(t, [(qa, qb) for qa, qb, _ in blocks]) for t in (query, key, value))
        return torch.cat([_block(module, q, k, v, block, dropout, scaling) for block in blocks], dim=1), None
    spans = segments(position_ids[0]) if position_ids is not None and query.shape[0] == 1 else []
    if len(spans) < 2 or query.shape[2] != key.shape[2]:  # not a packed row (or a cached decode): plain SDPA
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    q, k, v = (_pieces(t, spans) for t in (query, key, value))
    outs = [sdpa_attention_forward(module, q[a], k[a], v[a], None, dropout=dropout, scaling=scaling,
                                   is_causal=True)[0] for a, _ in spans]
    return torch.cat(outs, dim=1), None


def _pieces(t: torch.Tensor, spans: list[tuple[int, int]]) -> dict[int, torch.Tensor]:
    """(B, heads, L, D) cut along L into the consecutive `spans` that cover it, by start. One split, not a
    slice per span: a slice's backward writes its gradient into a zero tensor the size of the whole row, so a
    row of n spans would allocate and add n row-sized tensors per layer; a split's backward is one cat."""
    return dict(zip([a for a, _ in spans], t.split([b - a for a, b in spans], dim=2), strict=True))


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


def _block(module: torch.nn.Module, query: dict[int, torch.Tensor], key: dict[int, torch.Tensor],
           value: dict[int, torch.Tensor], block: tuple[int, int, tuple[tuple[int, int], ...]], dropout: float,
           scaling: float | None) -> torch.Tensor:
    """One block's attention; `query`, `key`, `value`: the row's pieces by the start of their block (a prefix
    span is an earlier block)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    qa, qb, spans = block
    q, k, v = query[qa], key[qa], value[qa]
    if not spans:
        return sdpa_attention_forward(module, q, k, v, None, dropout=dropout, scaling=scaling, is_causal=True)[0]
    n, p = qb - qa, sum(pb - pa for pa, pb in spans)
    mask = torch.ones(n, p + n, dtype=torch.bool, device=q.device)
    mask[:, p:] = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    keys = torch.cat([*(key[pa] for pa, _ in spans), k], 2)
    values = torch.cat([*(value[pa] for pa, _ in spans), v], 2)
    return sdpa_attention_forward(module, q, keys, values, mask[None, None], dropout=dropout, scaling=scaling)[0]
