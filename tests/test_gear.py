"""GEAR (ground-truth-conditioned form): segment weights by hand, and the real SmolLM2 teacher/student."""

import numpy as np
import pytest

import sleuth
from sleuth.agents.loop import run_episodes
from sleuth.agents.policy import load_policy
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
    adv = est(group, {task.id: task}).values
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
    adv = GearMix(granularities=["outcome", "tool"])([a, b], {}).values
    # outcome: grpo of (1, 0) → ±0.70711; tool: turns (+1, +1, −1, +1) → mean 0.5, std 0.86603 → z = 0.57735 / −1.73205
    assert adv[0].shape == (4, 2)
    assert adv[0][:, 0].tolist() == pytest.approx([0.70711] * 4, abs=1e-4)
    assert adv[1][:, 1].tolist() == pytest.approx([-1.73205, -1.73205, 0.57735, 0.57735], abs=1e-4)


def test_mixing_starts_uniform_and_distillation_is_zero_for_identical_teacher(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    from sleuth.rewards.base import MixingSpec
    from sleuth.training.forward import Scored
    from sleuth.training.mixing import Mixing

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    mix = Mixing(MixingSpec(granularities=3, entropy_coef=0.1), model, model.config.hidden_size)
    hidden = torch.randn(2, 5, model.config.hidden_size)
    adv_k = torch.randn(2, 5, 3)
    ids = torch.randint(0, 500, (2, 5))
    mask = torch.ones(2, 5)
    logits = model(input_ids=ids).logits[:, :-1][mask[:, 1:].bool()]
    terms = mix.terms(Scored(hidden, 1.0, model.get_output_embeddings(), full=logits), adv_k, ids, torch.ones_like(ids), mask)
    assert torch.allclose(terms.weights, torch.full_like(terms.weights, 1 / 3))  # uniform at initialisation
    assert torch.allclose(terms.advantage, adv_k.mean(-1)) and not terms.advantage.requires_grad
    # the teacher is the student (KL = 0): what is left is the head's −λ·H(w) at uniform weights
    assert torch.allclose(terms.per_token, torch.full_like(terms.per_token, -0.1 * np.log(3)), atol=1e-5)
    assert float(mix.distill_kl(logits, ids, torch.ones_like(ids), mask).detach().abs().max()) < 1e-5


def test_mixing_head_does_not_learn_to_maximise_the_advantage(tiny_model_dir):
    """Granularities with zero mean but one of them larger where the head can see it: trained through the
    policy loss the head would learn to pick the larger one (the mean mixed advantage drifted 0 → +0.29 in
    300 steps); trained on its own objective only, the mixed advantage stays zero-mean."""
    import torch
    from transformers import AutoModelForCausalLM

    from sleuth.rewards.base import MixingSpec
    from sleuth.training.forward import Scored
    from sleuth.training.losses import LossConfig, aggregate, policy_loss, scored_logprobs
    from sleuth.training.mixing import Mixing

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    mix = Mixing(MixingSpec(granularities=2, mixer_lr=0.05, ema_decay=1.0), model, model.config.hidden_size)
    with torch.no_grad():  # a teacher that differs from the student, so the distillation KL is not zero
        for p in mix.teacher.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ids = torch.randint(0, 500, (8, 6))
    mask = torch.ones(8, 6)
    mask[:, 0] = 0
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
    hidden = out.hidden_states[-1]
    logits = out.logits[:, :-1][mask[:, 1:].bool()].detach().requires_grad_()
    # which granularity is the larger one at token t is a function of the hidden state that predicts it
    sign = torch.where(hidden[..., 0] > hidden[..., 0].median(), 1.0, -1.0).roll(1, dims=1)
    adv_k = torch.stack([sign * 2.0, -sign * 0.5], -1)
    adv_k = adv_k - adv_k[mask.bool()].mean(0)  # each granularity has zero mean over the policy tokens
    means = []
    for _ in range(300):
        terms = mix.terms(Scored(hidden, 1.0, model.get_output_embeddings(), full=logits), adv_k, ids, torch.ones_like(ids), mask)
        logp, _ = scored_logprobs(logits, ids, mask)
        loss, _ = policy_loss(LossConfig(), logp, logp.detach(), terms.advantage, mask)
        (loss.total + aggregate(terms.per_token, mask, "token_mean", 1)).backward()
        mix.opt.step()
        mix.opt.zero_grad()
        means.append(float(terms.advantage[mask.bool()].mean()))
    assert float(mix.head.weight.detach().abs().sum()) > 0  # the head did learn (from the distillation objective)
    assert abs(np.mean(means[-100:])) < 0.1, np.mean(means[-100:])


def test_gear_mix_update_trains_the_head_and_moves_the_teacher(tiny_model_dir):
    import torch
    from train_helpers import fixed_batch
    from transformers import AutoModelForCausalLM

    from sleuth.rewards.base import MixingSpec
    from sleuth.training.engine import EngineConfig, build_engine, full_state_dict, init_distributed
    from sleuth.training.losses import LossConfig
    from sleuth.training.mixing import Mixing
    from sleuth.training.update import PolicyUpdater

    init_distributed()
    engine = build_engine(AutoModelForCausalLM.from_pretrained(tiny_model_dir), EngineConfig(zero_stage=2, lr=1e-3))
    mix = Mixing(MixingSpec(granularities=2, ema_decay=0.5, mixer_lr=0.1), engine.module, 64)
    trajs, advs = fixed_batch(4)
    two = [np.stack([a, -0.5 * a], -1) for a in advs]  # the granularities disagree
    updater = PolicyUpdater(engine, LossConfig(), 0, 4096, mixing=mix)
    stats = updater.update(trajs, two)
    assert stats["mix_weights"] == pytest.approx([0.5, 0.5])  # measured with the initial (uniform) head
    # what the loss used: ½A − ¼A per token (policy tokens of the update, longest trajectories first)
    want = sorted(np.concatenate([0.25 * a for a in advs]).tolist())
    assert sorted(stats["mixed_adv"]) == pytest.approx(want)
    assert float(mix.head.weight.detach().abs().sum()) == 0  # teacher = student: no distillation signal for the head yet
    name = "model.layers.0.mlp.down_proj.weight"
    teacher_before = dict(mix.teacher.named_parameters())[name].detach().clone()
    updater.update(trajs, two)  # now the EMA teacher lags the policy: KL > 0
    assert float(mix.head.weight.detach().abs().sum()) > 0
    after = full_state_dict(engine.module)
    teacher = dict(mix.teacher.named_parameters())[name]
    assert torch.allclose(teacher, 0.5 * teacher_before + 0.5 * after[name], atol=1e-6)
    assert not torch.allclose(teacher, after[name], atol=1e-6)


def test_gear_gt_refuses_a_policy_with_another_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    from sleuth.envs.retrieval.dense import minilm_dir

    est = GearGT(tiny_model_dir)
    est.check_policy(AutoTokenizer.from_pretrained(tiny_model_dir))  # SmolLM2's tokenizer: accepted
    with pytest.raises(ValueError, match="tokenizers differ"):
        est.check_policy(AutoTokenizer.from_pretrained(str(minilm_dir())))
