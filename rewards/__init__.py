"""Rewards and advantage estimators: registered, composable components that see only Trajectories.

`make_estimator("grpo")` returns a callable: trajectories → one advantage per policy token."""

from sleuth.rewards import contribution, gear, gigpo, group, info_gain  # noqa: F401  (register the estimators)
from sleuth.rewards.base import Estimator, estimators, make_estimator, register_estimator

__all__ = ["Estimator", "estimators", "make_estimator", "register_estimator"]
