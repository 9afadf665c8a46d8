"""GEAR: gear_gt's segment weights by hand, its reader refreshed from the policy and the real SmolLM2
teacher/student; gear_mix's granularities, mixing head and EMA teacher (plain and LoRA policies)."""

import numpy as np
import pytest

import sleuth
from sleuth.agents.loop.episodes import run_episodes
from sleuth.agents.policies.load import load_policy
from sleuth.rewards.gear import GearGT, segment_starts, segment_weights


def lora_policy(model_dir: str, r: int = 4, alpha: int = 8):
    """The tiny model with LoRA on q_proj and v_proj, lora_B random (so W + ΔW ≠ W)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, target_modules=["q_proj", "v_proj"],
                                             task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return model


def test_segment_weights_by_hand():
    div = np.array([0.5, 1.0, 6.0, 0.5, 1.0, 3.0])
    # mean 2; std = sqrt(47.5 / 6 − 4) = 1.979 → threshold 3.979 (κ = 1): only t = 2 is a spike
    ent = np.array([1, 1, 2, 2, 0.5, 2.0])
    # the segment starts at 2, continues through 3 (entropy 2 ≥ τ = 1), ends at 4 (0.5 < τ); t = 5 is
    # outside (entropy 2 but no segment open). d = D / 2 = (0.25, 0.5, 3, 0.25, 0.5, 1.5); with α = 1:
    # w = 1 + d at t ∉ segment, 1 + d_2 = 4 at t = 2, 3 → (1.25, 1.5, 4, 4, 1.5, 2.5), sum 14.75, mean 59/24
    w = segment_weights(div, ent, [], kappa=1.0, tau=1.0, alpha=1.0)
    assert w.tolist() == pytest.approx([30 / 59, 36 / 59, 96 / 59, 96 / 59, 36 / 59, 60 / 59])
    assert w.mean() == pytest.approx(1.0)
    # a new turn starting at index 3 ends the segment there: t = 3 gets its own 1 + 0.25
    # → (1.25, 1.5, 4, 1.25, 1.5, 2.5), sum 12, mean 2
    w = segment_weights(div, ent, [3], kappa=1.0, tau=1.0, alpha=1.0)
    assert w.tolist() == pytest.approx([0.625, 0.75, 2.0, 0.625, 0.75, 1.25])
    # α = 0.5: (1.125, 1.25, 2.5, 2.5, 1.25, 1.75), sum 10.375, mean 83/48
    w = segment_weights(div, ent, [], kappa=1.0, tau=1.0, alpha=0.5)
    assert w.tolist() == pytest.approx([54 / 83, 60 / 83, 120 / 83, 120 / 83, 60 / 83, 84 / 83])
    assert segment_starts(div, ent, [], kappa=1.0, tau=1.0).tolist() == [-1, -1, 2, 2, -1, -1]


def test_uniform_weights_when_teacher_equals_student():
    assert segment_weights(np.zeros(5), np.ones(5), []).tolist() == [1.0] * 5


def test_segment_weights_refuse_a_negative_divergence():
    with pytest.raises(ValueError, match="≥ 0"):
        segment_weights(np.array([0.5, -0.1]), np.ones(2), [])


def test_gear_gt_refreshes_from_the_policy_every_step(tiny_model_dir):
    est = GearGT(tiny_model_dir)
    assert all(est.refresh_due(step) for step in range(6))  # on-policy: the reader is the policy at every step
    assert [GearGT(est.reader, refresh_every=2).refresh_due(s) for s in range(4)] == [True, False, True, False]
    with pytest.raises(ValueError, match="refresh_every must be ≥ 1"):
        GearGT(est.reader, refresh_every=0)


def test_gear_gt_refresh_loads_the_merged_lora_policy(tiny_model_dir):
    """The reader becomes the policy: its weights are the LoRA policy's merged ones and its logits the
    policy's; the policy's raw (un-merged) names do not match the reader's and raise."""
    import torch

    from sleuth.training.zero import full_state_dict

    policy = lora_policy(tiny_model_dir)
    est = GearGT(tiny_model_dir)
    est.refresh(full_state_dict(policy))
    merged = full_state_dict(policy)
    assert all(torch.equal(v, merged[k]) for k, v in est.reader.model.state_dict().items())
    ids = torch.randint(0, 500, (1, 7))
    with torch.no_grad():
        assert torch.allclose(est.reader.model(input_ids=ids).logits, policy(input_ids=ids).logits, atol=1e-5)
    with pytest.raises(ValueError, match="parameter names differ"):
        est.refresh(policy.state_dict())  # base_model.model.…base_layer.weight, lora_A, lora_B
    with pytest.raises(ValueError, match="parameter names differ"):
        est.refresh({k: v for k, v in merged.items() if k != "lm_head.weight"})


def test_real_teacher_and_student_on_a_docread_group(hotpot_tasks):
    """SmolLM2 (standing in for a SmolLM2 policy: no refresh here) as teacher (with the gold answer in
    context) and student on an oracle episode and a first-k one: every trajectory's weights average 1, so its
    mean advantage stays GRPO's. The signals are read off the estimator's own calls (two ~950-token forwards
    of the 135M model per trajectory: the cost of this test)."""
    task = hotpot_tasks[0]
    make = lambda: sleuth.make("DocRead-v0", harness="text")  # noqa: E731
    group = list(run_episodes(make, [task], load_policy("oracle"))) + \
        list(run_episodes(make, [task], load_policy("first-k")))
    est = GearGT("smollm2")
    signals, token_signals = [], est.token_signals
    est.token_signals = lambda traj, t: signals.append(token_signals(traj, t)) or signals[-1]
    adv = est(group, {task.id: task}).values
    assert len(signals) == 2  # both trajectories have a non-zero outcome advantage: both are weighted
    kl, ent = signals[0]
    assert len(kl) == group[0].num_policy_tokens and np.all(kl >= -1e-5) and np.all(ent >= 0)
    a = 0.70711  # grpo of (1, 0)
    assert adv[0].mean() == pytest.approx(a, abs=1e-4)
    assert adv[0].max() > adv[0].min()  # the gold-conditioned teacher singles out some tokens
    assert adv[1].mean() == pytest.approx(-a, abs=1e-4) and np.all(adv[1] < 0)


def test_gear_mix_tool_granularity_by_hand():
    from sleuth.agents.trajectory import Trajectory, Turn
    from sleuth.rewards.gear import GearMix

    def traj(errors, reward):
        turns = [Turn([1, 2], [0.0, 0.0], "a", error=e) for e in errors]
        return Trajectory("t", "env", [1], turns=turns, reward=reward, group="t")

    a, b = traj([None, None], 1.0), traj(["bad call", None], 0.0)
    adv = GearMix(granularities=["outcome", "tool"])([a, b], {}).values
    # outcome: grpo of (1, 0) → ±0.70711; tool: turns (+1, +1, −1, +1) → mean 0.5, std 0.86603
    # → z = 0.57735 / −1.73205
    assert adv[0].shape == (4, 2)
    assert adv[0][:, 0].tolist() == pytest.approx([0.70711] * 4, abs=1e-4)
    assert adv[1][:, 1].tolist() == pytest.approx([-1.73205, -1.73205, 0.57735, 0.57735], abs=1e-4)


def test_mixing_starts_uniform_and_distillation_is_zero_for_identical_teacher(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    from sleuth.rewards.base import MixingSpec
    from sleuth.training.rl.forward import Scored
    from sleuth.training.rl.mixing import Mixing

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    mix = Mixing(MixingSpec(granularities=3, entropy_coef=0.1), model, model.config.hidden_size)
    hidden = torch.randn(2, 5, model.config.hidden_size)
    adv_k = torch.randn(2, 5, 3)
    ids = torch.randint(0, 500, (2, 5))
    mask = torch.ones(2, 5)
    logits = model(input_ids=ids).logits[:, :-1][mask[:, 1:].bool()]
    scored = Scored(hidden, 1.0, model.get_output_embeddings(), full=logits)
    terms = mix.terms(scored, adv_k, ids, torch.ones_like(ids), mask)
    assert torch.allclose(terms.weights, torch.full_like(terms.weights, 1 / 3))  # uniform at initialisation
    assert torch.allclose(terms.advantage, adv_k.mean(-1)) and not terms.advantage.requires_grad
    # the teacher is the student (KL = 0): what is left is the head's −λ·H(w) at uniform weights
    assert torch.allclose(terms.per_token, torch.full_like(terms.per_token, -0.1 * np.log(3)), atol=1e-5)
    assert float(mix.distill_kl(logits, ids, torch.ones_like(ids), mask).detach().abs().max()) < 1e-5


def test_mixing_head_does_not_learn_to_maximise_the_advantage():
    """Granularities with zero mean but one of them larger where the head can see it: trained through the
    policy loss the head would learn to pick the larger one (with the mixed advantage left differentiable, the
    mean here is +1.2 from step 10 on); trained on its own objective only, the mixed advantage stays zero-mean.
    A one-layer Llama over 128 ids: the head reads hidden states only, and SmolLM2's 49k-id logits (the teacher's
    forward and the KL over them, every step) made 300 steps cost ~75 CPU s."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from sleuth.rewards.base import MixingSpec
    from sleuth.training.rl.forward import Scored
    from sleuth.training.rl.losses import LossConfig, aggregate, policy_loss, scored_logprobs
    from sleuth.training.rl.mixing import Mixing

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    mix = Mixing(MixingSpec(granularities=2, mixer_lr=0.05, ema_decay=1.0), model, model.config.hidden_size)
    with torch.no_grad():  # a teacher that differs from the student, so the distillation KL is not zero
        for p in mix.teacher.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ids = torch.randint(0, 128, (8, 6))
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
    for _ in range(100):
        scored = Scored(hidden, 1.0, model.get_output_embeddings(), full=logits)
        terms = mix.terms(scored, adv_k, ids, torch.ones_like(ids), mask)
        logp, _ = scored_logprobs(logits, ids, mask)
        loss, _ = policy_loss(LossConfig(), logp, logp.detach(), terms.advantage, mask)
        (loss.total + aggregate(terms.per_token, mask, "token_mean", 1)).backward()
        mix.opt.step()
        mix.opt.zero_grad()
        means.append(float(terms.advantage[mask.bool()].mean()))
    assert float(mix.head.weight.detach().abs().sum()) > 0  # the head did learn (from the distillation objective)
    assert abs(np.mean(means[-50:])) < 0.1, np.mean(means[-50:])


@pytest.mark.parametrize("lora", [False, True])
def test_gear_mix_update_trains_the_head_and_moves_the_teacher(tiny_model_dir, lora):
    import torch
    from train_helpers import fixed_batch
    from transformers import AutoModelForCausalLM

    from sleuth.rewards.base import MixingSpec
    from sleuth.training.rl.losses import LossConfig
    from sleuth.training.rl.mixing import Mixing
    from sleuth.training.rl.update import PolicyUpdater, UpdateConfig
    from sleuth.training.zero import (
        DeepSpeedConfig,
        LoraConfig,
        build_engine,
        full_state_dict,
        init_distributed,
    )

    init_distributed()
    torch.manual_seed(0)
    engine = build_engine(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                          DeepSpeedConfig(zero_stage=2, lr=1e-3, lora=LoraConfig(r=4) if lora else None))
    mix = Mixing(MixingSpec(granularities=2, ema_decay=0.5, mixer_lr=0.1), engine.module, 64)
    trajs, advs = fixed_batch(4)
    two = [np.stack([a, -0.5 * a], -1) for a in advs]  # the granularities disagree
    updater = PolicyUpdater(engine, UpdateConfig(), LossConfig(), 0, mixing=mix)
    stats = updater.update(trajs, two)
    assert stats.mix_weights == pytest.approx([0.5, 0.5])  # measured with the initial (uniform) head
    # what the loss used: ½A − ¼A per token (policy tokens of the update, longest trajectories first)
    want = sorted(np.concatenate([0.25 * a for a in advs]).tolist())
    assert sorted(stats.mixed_adv) == pytest.approx(want)
    # teacher = student: no distillation signal for the head yet
    assert float(mix.head.weight.detach().abs().sum()) == 0
    name = "model.layers.0.self_attn.q_proj.weight"  # a LoRA target: with LoRA it moves through W + ΔW
    teacher_before = dict(mix.teacher.named_parameters())[name].detach().clone()
    updater.update(trajs, two)  # now the EMA teacher lags the policy: KL > 0
    assert float(mix.head.weight.detach().abs().sum()) > 0
    after = full_state_dict(engine.module)
    teacher = dict(mix.teacher.named_parameters())[name]
    assert torch.allclose(teacher, 0.5 * teacher_before + 0.5 * after[name], atol=1e-6)
    assert not torch.allclose(teacher, after[name], atol=1e-6)


def test_gear_mix_teacher_starts_as_the_merged_lora_policy(tiny_model_dir):
    """The teacher is a plain model (no LoRA layers) named as `full_state_dict` names the policy's merged
    weights, and holds exactly those: W + (α/r)·B·A on the LoRA targets, computed here by hand."""
    import torch

    from sleuth.rewards.base import MixingSpec
    from sleuth.training.rl.mixing import Mixing
    from sleuth.training.zero import full_state_dict

    policy = lora_policy(tiny_model_dir, r=4, alpha=8)
    mix = Mixing(MixingSpec(granularities=2), policy, policy.config.hidden_size)
    teacher = dict(mix.teacher.named_parameters())
    assert not any("lora_" in n or "base_layer" in n for n in teacher)
    merged = full_state_dict(policy)
    assert set(teacher) <= set(merged)
    assert all(torch.equal(p, merged[n]) for n, p in teacher.items())
    layer = "base_model.model.model.layers.0.self_attn.q_proj"
    params = dict(policy.named_parameters())
    w, a, b = (params[f"{layer}.{k}.weight"] for k in ("base_layer", "lora_A.default", "lora_B.default"))
    by_hand = w + 2.0 * b @ a  # α/r = 8/4
    assert torch.allclose(teacher["model.layers.0.self_attn.q_proj.weight"], by_hand, atol=1e-6)
    assert not torch.allclose(by_hand, w, atol=1e-3)  # the adapter does move it
    ids = torch.randint(0, 500, (2, 6))
    with torch.no_grad():
        assert torch.allclose(mix.teacher(input_ids=ids).logits, policy(input_ids=ids).logits, atol=1e-5)


def test_gear_mix_ema_follows_the_merged_lora_weights(tiny_model_dir):
    """After the adapters change, one `after_step` moves every teacher weight to d·old + (1−d)·merged; on a
    LoRA target by exactly (1−d)·(W + (α/r)·B'·A' − old)."""
    import torch

    from sleuth.rewards.base import MixingSpec
    from sleuth.training.rl.mixing import Mixing
    from sleuth.training.zero import full_state_dict

    d = 0.75
    policy = lora_policy(tiny_model_dir, r=4, alpha=8)
    mix = Mixing(MixingSpec(granularities=2, ema_decay=d), policy, policy.config.hidden_size)
    old = {n: p.detach().clone() for n, p in mix.teacher.named_parameters()}
    with torch.no_grad():  # what an optimizer step does to a LoRA policy: only the adapters move
        for n, p in policy.named_parameters():
            if "lora_" in n:
                p.add_(0.1 * torch.randn_like(p))
    merged = full_state_dict(policy)
    mix.after_step(policy)
    for n, p in mix.teacher.named_parameters():
        assert torch.allclose(p, d * old[n] + (1 - d) * merged[n], rtol=1e-6, atol=1e-7), n
    layer = "base_model.model.model.layers.1.self_attn.v_proj"
    params = dict(policy.named_parameters())
    w, a, b = (params[f"{layer}.{k}.weight"] for k in ("base_layer", "lora_A.default", "lora_B.default"))
    name = "model.layers.1.self_attn.v_proj.weight"
    moved = dict(mix.teacher.named_parameters())[name] - old[name]
    assert torch.allclose(moved, (1 - d) * (w + 2.0 * b @ a - old[name]), atol=1e-6)
    assert float(moved.abs().max()) > 1e-3


def test_gear_mix_ema_of_a_plain_policy_and_a_name_mismatch_raises(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    from sleuth.rewards.base import MixingSpec
    from sleuth.training.rl.mixing import Mixing

    d = 0.75
    torch.manual_seed(0)
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    mix = Mixing(MixingSpec(granularities=2, ema_decay=d), policy, policy.config.hidden_size)
    old = {n: p.detach().clone() for n, p in mix.teacher.named_parameters()}
    assert all(torch.equal(p, dict(policy.named_parameters())[n]) for n, p in old.items())
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.1 * torch.randn_like(p))
    new = {n: p.detach().clone() for n, p in policy.named_parameters()}
    mix.after_step(policy)
    for n, p in mix.teacher.named_parameters():
        assert torch.allclose(p, d * old[n] + (1 - d) * new[n], rtol=1e-6, atol=1e-7), n
        assert not torch.allclose(p, old[n])
    with pytest.raises(KeyError, match="lack"):  # e.g. a wrapper that prefixes every name
        mix.after_step(torch.nn.ModuleDict({"policy": policy}))


def test_gear_gt_refuses_a_policy_with_another_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    from sleuth.envs.retrieval.dense import minilm_dir

    est = GearGT(tiny_model_dir)
    est.check_policy(AutoTokenizer.from_pretrained(tiny_model_dir))  # SmolLM2's tokenizer: accepted
    with pytest.raises(ValueError, match="tokenizers differ"):
        est.check_policy(AutoTokenizer.from_pretrained(str(minilm_dir())))


def test_gear_mix_teacher_under_zero3_holds_the_full_weights(tiny_model_dir):
    """ZeRO-3 partitions the policy's parameters: the teacher is built from the config and loaded with the
    gathered weights, so it holds the whole model (a copy of the partitioned module would hold none)."""
    import torch
    from train_helpers import seeded_engine

    from sleuth.rewards.base import MixingSpec
    from sleuth.training.rl.mixing import Mixing
    from sleuth.training.zero import full_state_dict

    engine = seeded_engine(tiny_model_dir, zero_stage=3, lr=1e-3, dtype="fp32")
    mix = Mixing(MixingSpec(granularities=2), engine.module, engine.module.config.hidden_size)
    merged = full_state_dict(engine.module)
    teacher = dict(mix.teacher.named_parameters())
    assert teacher and all(p.numel() > 0 and torch.equal(p, merged[n]) for n, p in teacher.items())
