"""Advantages when an episode is recorded as several trajectories (an agent behind the gateway that rewrote
its history: one trajectory per segment). The group's statistics must count each episode once, so the
estimator sees one trajectory per episode, and every segment of the episode then trains with that episode's
advantage. That needs one number per episode: an estimator says so with `supports_segments` (the outcome estimators); a
step reward (`info_gain` over the reads `agents.gateway.reads` recognises) prices the turns of one token sequence,
so it trains agents whose episodes stay one segment, and an episode that split under it is refused."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from sleuth.agents.trajectory import Trajectory
from sleuth.rewards.base import Advantages, Estimator, supporting
from sleuth.tasks.base import Task


def per_episode(estimator: Estimator, trajs: Sequence[Trajectory], tasks: Mapping[str, Task]) -> Advantages:
    if all(t.segments == 1 for t in trajs):
        return estimator(trajs, tasks)
    if not estimator.supports_segments:
        split = next(t for t in trajs if t.segments > 1)
        raise ValueError(f"agent episode {split.episode} is {split.segments} segments (the agent rewrote its history) "
                         f"but {type(estimator).__name__} prices turns of one token sequence: train this agent with an "
                         f"estimator that declares supports_segments ({', '.join(supporting('supports_segments'))})")
    key = [t.episode or f"#{i}" for i, t in enumerate(trajs)]
    chosen: dict[str, int] = {}  # each episode's longest segment stands for it (its reward is the episode's)
    for i, k in enumerate(key):
        if k not in chosen or trajs[i].num_policy_tokens > trajs[chosen[k]].num_policy_tokens:
            chosen[k] = i
    order = list(chosen)
    est = estimator([trajs[chosen[k]] for k in order], tasks)
    value = {k: float(np.asarray(v).reshape(-1)[0]) if np.asarray(v).size else 0.0 for k, v in zip(order, est.values,
                                                                                                   strict=True)}
    return Advantages([np.full(t.num_policy_tokens, value[k]) for t, k in zip(trajs, key, strict=True)], est.metrics)
