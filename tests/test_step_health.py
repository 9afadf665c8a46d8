"""The trainer's health metrics against hand-computed values: the expected share of zero-variance groups
for the step's success rate and each group's effective sample size."""

import math

import pytest

from sleuth.training.rl.step_metrics import expected_zero_variance
from sleuth.training.rl.update import group_ess


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


def _part(update, rewards, adv, groups, zero_var, stream=None, failed=0):
    from sleuth.training.rl.step_metrics import StepPart

    return StepPart(update=update, rewards=rewards, truncated=[0.0] * len(rewards),
                    success=[float(r > 0) for r in rewards], length_correct=[10] * sum(r > 0 for r in rewards),
                    length_wrong=[20] * sum(r <= 0 for r in rewards), components={"f1": rewards}, adv=adv,
                    groups=groups, zero_var=zero_var, no_signal_groups=0, gen_tokens=30, failed=failed,
                    dropped_failed=0, reissued=0, stream=stream)


def test_the_step_row_gathers_two_ranks_typed_parts_by_hand():
    """Losses are numerators over one global denominator (summed over ranks), per-token metrics are means over
    every rank's tokens, group shares over every rank's groups."""
    from sleuth.training.rl.step_metrics import step_row
    from sleuth.training.rl.update import UpdateStats
    from sleuth.training.rollout.asynchronous import StreamStats

    a = UpdateStats(clip_low=[1.0, 0.0, 0.0], log_ratio=[0.1, 0.2, 0.3], loss_policy=0.25, loss_kl=0.5,
                    group_ess=[1.0, 0.5], grad_norm=2.0, optimizer_steps=1, train_tokens=40)
    b = UpdateStats(clip_low=[1.0], log_ratio=[-0.2], loss_policy=-0.75, group_ess=[0.25], grad_norm=2.0,
                    optimizer_steps=1, train_tokens=60)
    parts = [_part(a, [1.0, 0.0], [0.5, -0.5], 1, {"wrong": 1}, StreamStats(dropped=2, staleness=[0, 1], partial=1)),
             _part(b, [0.0, 0.0], [0.0, 0.0], 1, {}, failed=1)]
    row = step_row(parts, {"rollout": 2.0, "update": 4.0}, {"sync/max_logit_diff": 0.0}, False, 3, 2)
    assert row["loss/policy"] == pytest.approx(-0.5) and row["loss/kl"] == pytest.approx(0.5)
    assert row["clip/low"] == pytest.approx(0.5)  # 2 of 4 tokens, not the mean of the ranks' means (2/3)
    assert row["ppo_kl"] == pytest.approx(-0.1)  # −mean(0.1, 0.2, 0.3, −0.2)
    assert row["groups/ess_min"] == 0.25 and row["groups/ess_mean"] == pytest.approx(1.75 / 3)
    assert row["reward/mean"] == pytest.approx(0.25) and row["reward/f1/mean"] == pytest.approx(0.25)
    assert row["groups/zero_var"] == 0.5 and row["groups/zero_var_wrong"] == 0.5
    assert row["groups/zero_var_expected"] == pytest.approx(0.25**2 + 0.75**2)  # p = 1/4 over both ranks, G = 2
    assert row["tokens_per_s/update"] == pytest.approx(25.0) and row["tokens_per_s/rollout"] == pytest.approx(30.0)
    assert row["async/dropped"] == 2 and row["async/staleness_mean"] == 0.5 and row["policy_version"] == 3
    assert row["length/correct"] == 10 and row["length/wrong"] == 20
    assert row["episodes/sampled"] == 5 and row["episodes/failed"] == 1  # 2 + 2 scored, 1 failed on rank b
