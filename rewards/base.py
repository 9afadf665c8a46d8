"""The estimator contract: trajectories in, one advantage per policy token out.

An estimator sees only `Trajectory` objects (the rewards folder never touches the optimiser). Its output
is aligned with each trajectory's action tokens in order (`traj.num_policy_tokens` values), so an
outcome estimator broadcasts one number, a step estimator one number per turn, a token estimator
one per token. Estimators are registered by name and built from a config with keyword arguments."""

from __future__ import annotations

import importlib.metadata
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from sleuth.agents.trajectory import Trajectory

ESTIMATOR_GROUP = "sleuth.estimators"


class Estimator(Protocol):
    def __call__(self, trajs: Sequence[Trajectory]) -> list[np.ndarray]: ...


_ESTIMATORS: dict[str, Callable[..., Estimator]] = {}


def register_estimator(name: str) -> Callable[[Callable[..., Estimator]], Callable[..., Estimator]]:
    def deco(factory: Callable[..., Estimator]) -> Callable[..., Estimator]:
        _ESTIMATORS[name] = factory
        return factory
    return deco


def estimators() -> list[str]:
    _load_plugins()
    return sorted(_ESTIMATORS)


def make_estimator(name: str, **kwargs: Any) -> Estimator:
    """Build a registered estimator; unknown names and unknown arguments fail with the valid choices."""
    _load_plugins()
    if name not in _ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; registered: {', '.join(sorted(_ESTIMATORS))}")
    try:
        return _ESTIMATORS[name](**kwargs)
    except TypeError as e:
        raise ValueError(f"bad arguments for estimator {name!r}: {e}") from None


def _load_plugins() -> None:
    for ep in importlib.metadata.entry_points(group=ESTIMATOR_GROUP):
        if ep.name not in _ESTIMATORS:
            _ESTIMATORS[ep.name] = ep.load()


# -- helpers shared by estimators -------------------------------------------------------------------
def outcome(traj: Trajectory) -> float:
    """The outcome reward: the sum of the env's step rewards (the verdict's score for QA envs)."""
    return float(traj.reward)


def groups(trajs: Sequence[Trajectory]) -> dict[str, list[int]]:
    """Indices of trajectories per group key (the task id when no group was set)."""
    out: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(trajs):
        out[t.group or t.task_id].append(i)
    return dict(out)


def per_token(traj: Trajectory, value: float) -> np.ndarray:
    """One trajectory-level advantage broadcast over its action tokens."""
    return np.full(traj.num_policy_tokens, value, dtype=np.float64)


def per_turn(traj: Trajectory, values: Sequence[float]) -> np.ndarray:
    """Turn-level advantages (one per turn) broadcast over each turn's action tokens."""
    if len(values) != len(traj.turns):
        raise ValueError(f"{len(values)} turn values for {len(traj.turns)} turns")
    return np.concatenate([np.full(len(t.action_ids), v, dtype=np.float64) for t, v in zip(traj.turns, values, strict=True)]
                          or [np.zeros(0)])


def discounted_returns(rewards: Sequence[float], gamma: float) -> np.ndarray:
    """G_t = Σ_{k≥t} γ^{k−t} r_k for every t."""
    out, acc = np.zeros(len(rewards)), 0.0
    for t in reversed(range(len(rewards))):
        acc = rewards[t] + gamma * acc
        out[t] = acc
    return out
