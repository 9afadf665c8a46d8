"""Rewards and advantage estimators: registered, composable components that see only Trajectories.

`make_estimator("grpo")` returns an `Estimator`: `est(trajs, tasks).values` holds one advantage per policy
token of each trajectory."""

from sleuth.rewards import contribution, gear, gigpo, group, info_gain  # noqa: F401  (register the estimators)
from sleuth.rewards.base import (
    Advantages,
    Estimator,
    MixingSpec,
    estimators,
    make_estimator,
    register_estimator,
)

__all__ = ["Advantages", "Estimator", "MixingSpec", "estimators", "make_estimator", "register_estimator"]
