"""Trajectories + per-token advantages → padded training tensors, split into micro-batches.

The loss mask comes from the trajectory (1 exactly on the policy's sampled ids); the attention mask only
marks padding. Sequences are right-padded: position ids are then plain `arange`, as in the rollout. A packed
forward (`ScoredForward(packed=True)`) reads the same tensors and drops the padding itself."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from sleuth.agents.trajectory import Trajectory
from sleuth.training.distill.signal import TeacherTokens
from sleuth.training.rl.packing import layout


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, L) long
    attention_mask: torch.Tensor  # (B, L) long: 1 on real tokens
    loss_mask: torch.Tensor  # (B, L) float: 1 on policy tokens
    advantages: torch.Tensor  # (B, L) float, or (B, L, K) granularities to be mixed
    sampling_logprobs: torch.Tensor  # (B, L) float: the rollout engine's, 0 off the mask
    index: list[int]  # which trajectory each row holds
    old_logprobs: torch.Tensor | None = None  # (B, L) π_old of the ratio; None: the sampling logprobs
    teacher: TeacherTokens | None = None  # (B, L) rows of on-policy distillation's teacher numbers

    def __post_init__(self) -> None:
        if self.old_logprobs is None:
            self.old_logprobs = self.sampling_logprobs

    def __len__(self) -> int:
        return len(self.index)

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.input_ids.to(device), self.attention_mask.to(device), self.loss_mask.to(device),
                     self.advantages.to(device), self.sampling_logprobs.to(device), self.index,
                     self.old_logprobs.to(device), self.teacher.to(device) if self.teacher is not None else None)

    def with_loss_mask(self, mask: torch.Tensor) -> Batch:
        return Batch(self.input_ids, self.attention_mask, mask, self.advantages, self.sampling_logprobs,
                     self.index, self.old_logprobs, self.teacher)


def build_batch(trajs: Sequence[Trajectory], advantages: Sequence[np.ndarray], pad_id: int,
                index: Sequence[int] | None = None, old_logprobs: Sequence[torch.Tensor] | None = None,
                teacher: Sequence[TeacherTokens] | None = None) -> Batch:
    """Right-padded tensors of `trajs`; `old_logprobs` (one tensor per trajectory, aligned with its token
    ids) are π_old of the ratio, the sampling logprobs when not given; `teacher` a distillation teacher's
    numbers, one per trajectory, likewise aligned."""
    index = list(index) if index is not None else list(range(len(trajs)))
    width = max((len(t.token_ids()) for t in trajs), default=1)
    n = len(trajs)
    # (tokens,) advantages, or (tokens, K) granularities that the trainer mixes (GEAR's gear_mix)
    extra = tuple(np.shape(advantages[0])[1:]) if len(advantages) else ()
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.float32)
    adv = torch.zeros((n, width, *extra), dtype=torch.float32)
    slp = torch.zeros((n, width), dtype=torch.float32)
    old = torch.zeros((n, width), dtype=torch.float32) if old_logprobs is not None else None
    for row, (t, a) in enumerate(zip(trajs, advantages, strict=True)):
        tok = t.token_ids()
        m = torch.tensor(t.loss_mask(), dtype=torch.float32)
        if len(a) != t.num_policy_tokens:
            raise ValueError(f"trajectory {t.task_id}: {len(a)} advantages for {t.num_policy_tokens} policy tokens")
        ids[row, :len(tok)] = torch.tensor(tok)
        attn[row, :len(tok)] = 1
        mask[row, :len(tok)] = m
        full_adv = torch.zeros((len(tok), *extra))
        full_adv[m.bool()] = torch.as_tensor(a, dtype=torch.float32)
        adv[row, :len(tok)] = full_adv
        slp[row, :len(tok)] = torch.tensor(t.sampling_logprobs(), dtype=torch.float32)
        if old is not None:
            old[row, :len(tok)] = old_logprobs[row]
    return Batch(ids, attn, mask, adv, slp, index, old, _pad_teacher(teacher, width) if teacher is not None else None)


def _pad_teacher(rows: Sequence[TeacherTokens], width: int) -> TeacherTokens:
    """One trajectory's teacher numbers per row, right-padded with zeros (no signal) to `width`."""
    def pad(xs: list[torch.Tensor]) -> torch.Tensor:
        out = xs[0].new_zeros((len(xs), width, *xs[0].shape[1:]))
        for row, x in enumerate(xs):
            out[row, :len(x)] = x
        return out

    k = rows[0].topk_ids is not None
    return TeacherTokens(pad([r.logprobs for r in rows]), pad([r.signal for r in rows]), pad([r.turn for r in rows]),
                         pad([r.topk_ids for r in rows]) if k else None,
                         pad([r.topk_logprobs for r in rows]) if k else None)


def micro_batches(trajs: Sequence[Trajectory], advantages: Sequence[np.ndarray], pad_id: int,
                  max_tokens: int, old_logprobs: Sequence[torch.Tensor] | None = None,
                  packed: bool = False, share: bool = False,
                  teacher: Sequence[TeacherTokens] | None = None) -> list[Batch]:
    """Group trajectories (longest first, so padding stays small) into micro-batches of at most `max_tokens`
    tokens each; a longer single trajectory gets a micro-batch of its own. Counted as padded tokens (rows ×
    the longest row), or with `packed` as the tokens of the packed row the forward runs (`packing.layout`;
    with `share`, common prefixes counted once): each trajectory goes where it adds the fewest tokens (the
    first such micro-batch), so a group's members meet where their prompt is already laid out, and an
    episode's branches where it is."""
    seqs = [t.token_ids() for t in trajs]
    lengths = [len(s) for s in seqs]
    order = sorted(range(len(trajs)), key=lambda i: -lengths[i])
    if share:  # in token order, the prefix tree's: a group's members meet, and an episode's branches follow it
        order.sort(key=lambda i: seqs[i])
    out: list[list[int]] = []
    for i in order:
        if packed:
            best, added = None, lengths[i] + 1
            for g in out:
                cost = layout([seqs[j] for j in (*g, i)], share).tokens
                grows = cost - layout([seqs[j] for j in g], share).tokens
                if cost <= max_tokens and grows < added:
                    best, added = g, grows
            if best is not None:
                best.append(i)
                continue
        elif out and (len(out[-1]) + 1) * lengths[out[-1][0]] <= max_tokens:
            out[-1].append(i)
            continue
        out.append([i])
    return [build_batch([trajs[i] for i in idx], [advantages[i] for i in idx], pad_id, idx,
                        [old_logprobs[i] for i in idx] if old_logprobs is not None else None,
                        [teacher[i] for i in idx] if teacher is not None else None) for idx in out]
