"""Advantages when an episode is recorded as several trajectories (an agent behind the gateway that rewrote
its history: one trajectory per segment). The group's statistics must count each episode once, so the
estimator sees one trajectory per episode, and every segment of the episode then trains with that episode's
advantage. That needs one number per episode (the outcome estimators: grpo, dr_grpo, rloo): a step reward
(`info_gain` over the reads `agents.gateway.reads` recognises) prices the turns of one token sequence, so it
trains agents whose episodes stay one segment, and an episode that split under it is refused."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from sleuth.agents.trajectory import Trajectory
from sleuth.rewards.base import Advantages, Estimator
from sleuth.tasks.base import Task


def per_episode(estimator: Estimator, trajs: Sequence[Trajectory], tasks: Mapping[str, Task]) -> Advantages:
    if all(t.segments == 1 for t in trajs):
        return estimator(trajs, tasks)
    key = [t.episode or f"#{i}" for i, t in enumerate(trajs)]
    chosen: dict[str, int] = {}  # each episode's longest segment stands for it (its reward is the episode's)
    for i, k in enumerate(key):
        if k not in chosen or trajs[i].num_policy_tokens > trajs[chosen[k]].num_policy_tokens:
            chosen[k] = i
    order = list(chosen)
    est = estimator([trajs[chosen[k]] for k in order], tasks)
    for k, v in zip(order, est.values, strict=True):
        if np.asarray(v).size and np.ptp(np.asarray(v)) > 0:
            raise ValueError(f"agent episode {k} is {trajs[chosen[k]].segments} segments (the agent rewrote its "
                             f"history) but the estimator gave its turns different advantages: step rewards need "
                             f"each episode in one segment; train this agent with an outcome estimator "
                             f"(grpo, dr_grpo, rloo)")
    value = {k: float(np.asarray(v).reshape(-1)[0]) if np.asarray(v).size else 0.0 for k, v in zip(order, est.values,
                                                                                                   strict=True)}
    return Advantages([np.full(t.num_policy_tokens, value[k]) for t, k in zip(trajs, key, strict=True)], est.metrics)
