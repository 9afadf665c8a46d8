"""GEAR (ground-truth-conditioned form): segment weights by hand, and the real SmolLM2 teacher/student."""

import numpy as np
import pytest

import sleuth
from sleuth.agents.loop import run_episodes
from sleuth.agents.policies import load_policy
from sleuth.rewards.gear import GearGT, segment_weights


def test_segment_weights_by_hand():
    div = np.array([0, 0, 5, 0, 0, 0.0])  # mean 0.833, std 1.863 → only t = 2 is a spike (κ = 1)
    ent = np.array([1, 1, 2, 2, 0.5, 2.0])
    # the segment starts at 2, continues through 3 (entropy 2 ≥ τ = 1), ends at 4 (0.5 < τ)
    w = segment_weights(div, ent, [], kappa=1.0, tau=1.0, alpha=1.0)
    assert w.tolist() == pytest.approx([0.75, 0.75, 1.5, 1.5, 0.75, 0.75])
    assert w.mean() == pytest.approx(1.0)
    # a new turn starting at index 3 ends the segment there
    w = segment_weights(div, ent, [3], kappa=1.0, tau=1.0, alpha=1.0)
    assert w.tolist() == pytest.approx([6 / 7, 6 / 7, 12 / 7, 6 / 7, 6 / 7, 6 / 7])


def test_uniform_weights_when_teacher_equals_student():
    assert segment_weights(np.zeros(5), np.ones(5), []).tolist() == [1.0] * 5


def test_real_teacher_and_student_on_a_docread_group(hotpot_tasks):
    """SmolLM2 as teacher (with the gold answer in context) and student on an oracle episode and two
    first-k episodes: every trajectory's weights average 1, so its mean advantage stays GRPO's."""
    task = hotpot_tasks[0]
    make = lambda: sleuth.make("DocRead-v0", harness="text")  # noqa: E731
    group = list(run_episodes(make, [task], load_policy("oracle"))) + \
        list(run_episodes(make, [task] * 2, load_policy("first-k")))
    est = GearGT("smollm2")
    kl, ent = est.token_signals(group[0], task)
    assert len(kl) == group[0].num_policy_tokens and np.all(kl >= -1e-5) and np.all(ent >= 0)
    adv = est(group, {task.id: task})
    a = 1.1547  # grpo of (1, 0, 0)
    assert adv[0].mean() == pytest.approx(a, abs=1e-4)
    assert adv[0].max() > adv[0].min()  # the gold-conditioned teacher singles out some tokens
    assert adv[1].mean() == pytest.approx(-0.57735, abs=1e-4) and np.all(adv[1] < 0)
