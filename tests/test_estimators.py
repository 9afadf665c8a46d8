"""Advantage estimators against hand-computed numbers."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sleuth.agents.trajectory import Trajectory, Turn
from sleuth.rewards import estimators, make_estimator
from sleuth.rewards.group import group_advantages


def traj(task: str, reward: float, tokens=(2, 3)) -> Trajectory:
    turns = [Turn(list(range(n)), [0.0] * n, "x", observation_ids=[9]) for n in tokens]
    return Trajectory(task, "env", [1, 2], turns=turns, reward=reward, group=task)


def test_grpo_by_hand():
    # rewards 1, 0, 0, 1 → mean 0.5, sample std √(4·0.25/3) = 0.57735 → ±0.86603
    trajs = [traj("a", r) for r in (1, 0, 0, 1)] + [traj("b", r) for r in (0.2, 0.8)]
    adv = make_estimator("grpo")(trajs)
    assert [a[0] for a in adv[:4]] == pytest.approx([0.86603, -0.86603, -0.86603, 0.86603], abs=1e-4)
    # 0.2, 0.8 → mean 0.5, sample std 0.42426 → ∓0.70711 = ∓(G−1)/√G, the bound reached
    assert [a[0] for a in adv[4:]] == pytest.approx([-0.70711, 0.70711], abs=1e-4)
    assert all(len(a) == 5 and np.all(a == a[0]) for a in adv)  # broadcast over both turns' tokens


def test_dr_grpo_and_rloo_by_hand():
    trajs = [traj("a", r) for r in (1.0, 0.0, 0.0)]
    dr = [a[0] for a in make_estimator("dr_grpo")(trajs)]
    assert dr == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    rloo = [a[0] for a in make_estimator("rloo")(trajs)]
    # r_i − mean of the others: 1 − 0, 0 − 0.5, 0 − 0.5
    assert rloo == pytest.approx([1.0, -0.5, -0.5])


def test_zero_variance_group_gets_zero_advantage():
    adv = make_estimator("grpo")([traj("a", 0.3)] * 4)
    assert all(np.all(a == 0) for a in adv)


@given(st.lists(st.floats(0, 1), min_size=2, max_size=16))
def test_grpo_bound(rewards):
    g = len(rewards)
    a = group_advantages(np.array(rewards), "grpo", eps=0.0) if np.std(rewards) > 0 else np.zeros(g)
    assert np.all(np.abs(a) <= (g - 1) / math.sqrt(g) + 1e-9)


def test_unknown_estimator_and_arguments_are_refused():
    with pytest.raises(ValueError, match="registered: .*grpo"):
        make_estimator("grpo2")
    with pytest.raises(ValueError, match="bad arguments"):
        make_estimator("dr_grpo", eps=1)
    assert {"grpo", "dr_grpo", "rloo"} <= set(estimators())
