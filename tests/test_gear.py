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


def test_gear_mix_tool_granularity_by_hand():
    from sleuth.agents.trajectory import Trajectory, Turn
    from sleuth.rewards.gear import GearMix

    def traj(errors, reward):
        turns = [Turn([1, 2], [0.0, 0.0], "a", error=e) for e in errors]
        return Trajectory("t", "env", [1], turns=turns, reward=reward, group="t")

    a, b = traj([None, None], 1.0), traj(["bad call", None], 0.0)
    adv = GearMix(granularities=["outcome", "tool"])([a, b])
    # outcome: grpo of (1, 0) → ±0.70711; tool: turns (+1, +1, −1, +1) → mean 0.5, std 0.86603 → z = 0.57735 / −1.73205
    assert adv[0].shape == (4, 2)
    assert adv[0][:, 0].tolist() == pytest.approx([0.70711] * 4, abs=1e-4)
    assert adv[1][:, 1].tolist() == pytest.approx([-1.73205, -1.73205, 0.57735, 0.57735], abs=1e-4)


def test_mixing_starts_uniform_and_distillation_is_zero_for_identical_teacher(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    from sleuth.training.mixing import Mixing, MixingConfig

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    mix = Mixing(MixingConfig(granularities=3, entropy_coef=0.1), model, model.config.hidden_size)
    hidden = torch.randn(2, 5, model.config.hidden_size)
    adv_k = torch.randn(2, 5, 3)
    adv, ent_term, w = mix.combine(hidden, adv_k)
    assert torch.allclose(w, torch.full_like(w, 1 / 3))  # uniform at initialisation
    assert torch.allclose(adv, adv_k.mean(-1))
    assert torch.allclose(ent_term, torch.full_like(ent_term, -0.1 * np.log(3)), atol=1e-6)
    ids = torch.randint(0, 500, (2, 5))
    mask = torch.ones(2, 5)
    logits = model(input_ids=ids).logits
    d = mix.distill(logits, ids, torch.ones_like(ids), mask, adv, 1.0)
    assert float(d.abs().max()) < 1e-5  # the teacher is the student: KL = 0


def test_gear_mix_update_trains_the_head_and_moves_the_teacher(tiny_model_dir):
    import torch
    from train_helpers import fixed_batch
    from transformers import AutoModelForCausalLM

    from sleuth.training.engine import EngineConfig, build_engine, full_state_dict, init_distributed
    from sleuth.training.losses import LossConfig
    from sleuth.training.mixing import Mixing, MixingConfig
    from sleuth.training.update import PolicyUpdater

    init_distributed()
    engine = build_engine(AutoModelForCausalLM.from_pretrained(tiny_model_dir), EngineConfig(zero_stage=2, lr=1e-3))
    mix = Mixing(MixingConfig(granularities=2, ema_decay=0.5, mixer_lr=0.1), engine.module, 64)
    before = full_state_dict(engine.module)
    trajs, advs = fixed_batch(4)
    two = [np.stack([a, -a], -1) for a in advs]  # the granularities disagree: the head must pick
    stats = PolicyUpdater(engine, LossConfig(), 0, 4096, mixing=mix).update(trajs, two)
    assert stats["mix_weights"] == pytest.approx([0.5, 0.5])  # measured with the initial (uniform) head
    assert float(mix.head.weight.abs().sum()) > 0  # the head learned from the policy loss
    after = full_state_dict(engine.module)
    name = "model.layers.0.mlp.down_proj.weight"
    teacher = dict(mix.teacher.named_parameters())[name]
    assert torch.allclose(teacher, 0.5 * before[name] + 0.5 * after[name], atol=1e-6)
