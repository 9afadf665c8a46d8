"""GiGPO (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training", arXiv:2505.10978).

Episode level: A^E_i = GRPO advantage of the outcome R_i within the task group.
Step level: turns of the group's trajectories that start from the same *anchor state* (here: the same
sequence of environment observations so far, i.e. the same documents shown in the same order) form a
step group; each such turn's discounted return G_{i,t} = Σ_{k≥t} γ^{k−t} r_{i,k} (r: the step rewards, plus
the outcome R_i on the last turn) is normalised within its step group:
    A^S_{i,t} = (G_{i,t} − mean) / (std + ε)   (0 for a step group of one),
with the sample (unbiased, n−1) std at both levels, as verl-agent computes both (`torch.std`);
and A_{i,t} = A^E_i + ω · A^S_{i,t}.
Step rewards are 0 unless `step_reward` names an information-gain configuration (e.g. {variant:
gold_prob}), which composes CIGPO's per-read rewards into GiGPO's step returns.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sleuth.agents.trajectory import Trajectory
from sleuth.rewards.base import (
    Advantages,
    Estimator,
    discounted_returns,
    groups,
    outcome,
    per_turn,
    register,
)
from sleuth.rewards.group import GroupOutcome
from sleuth.rewards.info_gain import InfoGain


def anchor_keys(traj: Trajectory) -> list[tuple[str, ...]]:
    """The state each turn starts from: the observations the env returned before it."""
    keys, seen = [], ()
    for turn in traj.turns:
        keys.append(seen)
        seen = (*seen, turn.observation)
    return keys


class GiGPO(Estimator):
    def __init__(self, omega: float = 1.0, gamma: float = 0.95, eps: float = 1e-6,
                 step_reward: Mapping[str, Any] | None = None):
        self.omega, self.gamma, self.eps = omega, gamma, eps
        self.episode = GroupOutcome("grpo", eps)
        self.step_source: InfoGain | None = InfoGain(**dict(step_reward)) if step_reward is not None else None

    def step_advantages(self, trajs: Sequence[Trajectory], steps: Sequence[Sequence[float]]) -> list[np.ndarray]:
        returns = []
        for traj, r in zip(trajs, steps, strict=True):
            rewards = list(r)
            if rewards:
                rewards[-1] += outcome(traj)
            returns.append(discounted_returns(rewards, self.gamma))
        adv = [np.zeros(len(t.turns)) for t in trajs]
        for idx in groups(trajs).values():
            buckets: dict[tuple[str, ...], list[tuple[int, int]]] = defaultdict(list)
            for i in idx:
                for t, key in enumerate(anchor_keys(trajs[i])):
                    buckets[key].append((i, t))
            for members in buckets.values():
                if len(members) < 2:
                    continue
                g = np.array([returns[i][t] for i, t in members])
                for (i, t), v in zip(members, (g - g.mean()) / (g.std(ddof=1) + self.eps), strict=True):
                    adv[i][t] = v
        return adv

    def __call__(self, trajs: Sequence[Trajectory], tasks: Mapping[str, Any]) -> Advantages:
        metrics: dict[str, list[float]] = {}
        if self.step_source is not None:
            steps = self.step_source.step_rewards(trajs, tasks)
            metrics = self.step_source.step_metrics(trajs, steps)
        else:
            steps = [[0.0] * len(t.turns) for t in trajs]
        episode = self.episode.trajectory_advantages(trajs)
        step = self.step_advantages(trajs, steps)
        return Advantages([per_turn(t, (episode[i] + self.omega * step[i]).tolist()) for i, t in enumerate(trajs)],
                          metrics)


@register("gigpo", source="sleuth")
def gigpo(**kwargs: Any) -> GiGPO:
    return GiGPO(**kwargs)
