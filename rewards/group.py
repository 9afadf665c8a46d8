"""Outcome-level group estimators: GRPO, Dr.GRPO and RLOO.

- `grpo` (Shao et al. 2024, DeepSeekMath): A_i = (r_i − mean(r)) / (std(r) + eps), with the sample
  (unbiased, G−1) std as TRL and verl compute it (`torch.std`). Its bound: |A_i| ≤ (G−1)/√G.
- `dr_grpo` (Liu et al. 2025, "Understanding R1-Zero-like training"): A_i = r_i − mean(r), no std
  division (pair it with the `seq_mean_token_sum_norm` loss aggregation).
- `rloo` (Ahmadian et al. 2024): A_i = r_i − mean_{j≠i} r_j = G/(G−1)·(r_i − mean(r)).
- `none`: 0 everywhere (pure on-policy distillation, where the teacher is the only signal).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sleuth.agents.trajectory import Trajectory
from sleuth.rewards.base import Advantages, Estimator, groups, outcome, per_token, register


def group_advantages(rewards: np.ndarray, kind: str, eps: float = 1e-6) -> np.ndarray:
    """Outcome advantages for one group of rewards."""
    centred = rewards - rewards.mean()
    g = len(rewards)
    if kind == "grpo":
        return centred / (rewards.std(ddof=1) + eps) if g > 1 else np.zeros_like(rewards)
    if kind == "dr_grpo":
        return centred
    if kind == "rloo":
        return centred * g / (g - 1) if g > 1 else np.zeros_like(rewards)
    raise ValueError(f"unknown group advantage {kind!r}")


class GroupOutcome(Estimator):
    """One advantage per trajectory from its group's outcome rewards, broadcast over its tokens."""

    supports_agents = True  # outcome only: nothing of an env's state
    supports_segments = True  # one number per episode

    def __init__(self, kind: str, eps: float = 1e-6):
        self.kind, self.eps = kind, eps

    def trajectory_advantages(self, trajs: Sequence[Trajectory]) -> np.ndarray:
        adv = np.zeros(len(trajs))
        for idx in groups(trajs).values():
            rewards = np.array([outcome(trajs[i]) for i in idx], dtype=np.float64)
            adv[idx] = group_advantages(rewards, self.kind, self.eps)
        return adv

    def __call__(self, trajs: Sequence[Trajectory], tasks: Mapping[str, Any]) -> Advantages:
        return Advantages([per_token(t, a) for t, a in zip(trajs, self.trajectory_advantages(trajs), strict=True)])


@register("grpo", source="sleuth")
def grpo(eps: float = 1e-6) -> GroupOutcome:
    return GroupOutcome("grpo", eps)


@register("dr_grpo", source="sleuth")
def dr_grpo() -> GroupOutcome:
    return GroupOutcome("dr_grpo")


@register("rloo", source="sleuth")
def rloo() -> GroupOutcome:
    return GroupOutcome("rloo")


@register("none", source="sleuth")
class NoAdvantage(Estimator):
    """Every advantage 0: the run learns only from what the trainer adds to them (`algorithm.distill`: pure
    on-policy distillation). No group baseline, so a group of one is fine."""

    group_relative = False
    supports_agents = True
    supports_segments = True

    def __call__(self, trajs: Sequence[Trajectory], tasks: Mapping[str, Any]) -> Advantages:
        return Advantages([np.zeros(t.num_policy_tokens) for t in trajs])
