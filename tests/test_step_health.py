"""The trainer's health metrics against hand-computed values: the expected share of zero-variance groups
for the step's success rate and each group's effective sample size."""

import math

import pytest

from sleuth.training.step_metrics import expected_zero_variance
from sleuth.training.update import group_ess


def test_expected_zero_variance_by_hand():
    # p = 1/4, G = 4: (1/4)^4 + (3/4)^4 = 1/256 + 81/256
    assert expected_zero_variance([1, 0, 0, 0], 4) == pytest.approx(82 / 256)
    assert expected_zero_variance([0, 0], 8) == 1.0 and expected_zero_variance([1, 1], 2) == 1.0
    # p = 1/2, G = 2: a coin pair agrees half the time
    assert expected_zero_variance([1, 0], 2) == pytest.approx(0.5)
    assert math.isnan(expected_zero_variance([], 4))


def test_group_ess_by_hand():
    # w = (1, 3): (1 + 3)² / (2 · (1 + 9)) = 0.8; invariant to a common factor (log-weights shifted by 7)
    assert group_ess([0.0, math.log(3)]) == pytest.approx(0.8)
    assert group_ess([7.0, 7.0 + math.log(3)]) == pytest.approx(0.8)
    assert group_ess([0.0, 0.0, 0.0, 0.0]) == pytest.approx(1.0)
    assert group_ess([0.0, -1000.0, -1000.0, -1000.0]) == pytest.approx(0.25)  # one member carries the group
