"""Rewards and advantage estimators: registered, composable components that see only Trajectories.

`sleuth.rewards.make("grpo")` returns an `Estimator`: `est(trajs, tasks).values` holds one advantage per
policy token of each trajectory. `sleuth.rewards.register("name", cls)` adds one (an `Estimator` subclass, a
factory of one, or a "module:attr" string; `@sleuth.rewards.register("name")` decorates a class); `names()`
lists them (the registry is `ESTIMATORS`; plugins declare theirs under the entry-point group
`sleuth.estimators`)."""

# the estimators' modules register them on import
from sleuth.rewards import contribution, gear, gigpo, group, info_gain  # noqa: E402, F401, I001
from sleuth.rewards.base import (
    ESTIMATORS,
    Advantages,
    Estimator,
    MixingSpec,
    make,
    names,
    register,
)

__all__ = ["ESTIMATORS", "Advantages", "Estimator", "MixingSpec", "make", "names", "register"]
