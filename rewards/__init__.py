"""Rewards and advantage estimators: registered, composable components that see only Trajectories.

`make_estimator("grpo")` returns a callable: trajectories → one advantage per policy token."""

from sleuth.rewards import group, info_gain  # noqa: F401  (registers grpo, dr_grpo, rloo, info_gain)
from sleuth.rewards.base import Estimator, estimators, make_estimator, register_estimator

__all__ = ["Estimator", "estimators", "make_estimator", "register_estimator"]
