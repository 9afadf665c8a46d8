"""Policy-loss math against hand-computed numbers."""

import math

import pytest
import torch

from sleuth.training.rl.losses import (
    LossConfig,
    aggregate,
    denominator,
    importance_weights,
    kl_penalty,
    policy_loss,
    token_logprobs,
)


def _t(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_ppo_clip_with_separate_low_and_high():
    cfg = LossConfig(eps_low=0.2, eps_high=0.3)
    # ratios e^Δ: 1.5 (A>0: clipped at 1.3), 0.5 (A<0: clipped at 0.8), 1.1 (A>0: inside)
    old = torch.zeros(1, 3)
    logp = torch.log(_t([1.5, 0.5, 1.1]))
    adv = _t([2.0, -1.0, 1.0])
    mask = torch.ones(1, 3)
    terms, stats = policy_loss(cfg, logp, old, adv, mask)
    # per token: max(-A r, -A clip(r)) = [-2.6, 0.8, -1.1]; token_mean numerator = sum = -2.9
    assert float(terms.policy) == pytest.approx(-2.9, abs=1e-5) and float(terms.total) == float(terms.policy)
    assert stats["clip_high"].tolist() == [1.0, 0.0, 0.0]
    assert stats["clip_low"].tolist() == [0.0, 1.0, 0.0]


def test_dual_clip_caps_negative_advantage_loss():
    cfg = LossConfig(eps_low=0.2, eps_high=0.2, dual_clip=3.0)
    logp = torch.log(_t([10.0, 10.0]))
    terms, stats = policy_loss(cfg, logp, torch.zeros(1, 2), _t([-1.0, 1.0]), torch.ones(1, 2))
    # A=-1, r=10: plain PPO gives 10, dual clip caps at 3; A=+1, r=10: -min(10, 1.2) = -1.2
    assert float(terms.policy) == pytest.approx(3.0 - 1.2, abs=1e-5)
    assert stats["clip_dual"].tolist() == [1.0, 0.0] and stats["clip_high"].tolist() == [0.0, 1.0]


def test_kl_estimators_by_hand():
    logp, ref = _t([math.log(0.5)]), _t([math.log(0.25)])
    log_r = math.log(0.25) - math.log(0.5)  # log(π_ref/π) = -ln 2
    assert float(kl_penalty(logp, ref, "k1")) == pytest.approx(-log_r)
    assert float(kl_penalty(logp, ref, "k2")) == pytest.approx(0.5 * log_r**2)
    assert float(kl_penalty(logp, ref, "k3")) == pytest.approx(0.5 - 1 - log_r)  # r - 1 - log r, r = 0.5


def test_aggregation_modes_by_hand():
    per = _t([1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0])
    mask = _t([1, 1, 1, 0], [1, 0, 0, 0])
    assert float(aggregate(per, mask, "token_mean", 8)) / denominator(mask, "token_mean") == pytest.approx(10 / 4)
    # per sequence means 2 and 4, averaged over two sequences
    assert float(aggregate(per, mask, "seq_mean_token_mean", 8)) / denominator(mask, "seq_mean_token_mean") == \
        pytest.approx(3.0)
    # Dr.GRPO: sums divided by a constant length (8) and the number of sequences
    assert float(aggregate(per, mask, "seq_mean_token_sum_norm", 8)) / denominator(mask, "seq_mean_token_mean") == \
        pytest.approx(10 / 8 / 2)


def test_gspo_uses_the_sequence_ratio():
    cfg = LossConfig(policy_loss="gspo")
    logp = torch.log(_t([2.0, 0.5])).requires_grad_()
    terms, stats = policy_loss(cfg, logp, torch.zeros(1, 2), _t([1.0, 1.0]), torch.ones(1, 2))
    # geometric mean of 2 and 0.5 is 1: both tokens carry ratio 1 and the sequence gradient
    assert stats["ratio"].tolist() == pytest.approx([1.0, 1.0])
    terms.total.backward()
    assert logp.grad[0].tolist() == pytest.approx([-0.5, -0.5])  # −A·s/|y|: seq_mean_token_mean divides by |y|


@pytest.mark.filterwarnings("ignore:loss.policy_loss gspo clips")
def test_gspo_is_the_sequence_objective_by_hand():
    """Two sequences of lengths 1 and 3, A = +1 and −1, π_old = 1 (log 0): GSPO's objective
    J = ½ Σ_i A_i·s_i with s_i = (Π_t π_t)^(1/|y_i|), so the loss numerator (before ÷ 2 sequences) is
    −(s_1 − s_2) and ∂/∂logp_{i,t} = −A_i·s_i/|y_i|."""
    cfg = LossConfig(policy_loss="gspo", eps_low=0.9, eps_high=10.0)  # a wide clip: nothing clips here
    lp = [[math.log(0.5), 0.0, 0.0], [math.log(0.4), math.log(0.8), math.log(0.2)]]
    logp = torch.tensor(lp).requires_grad_()
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([[1.0, 0.0, 0.0], [-1.0, -1.0, -1.0]])
    terms, _ = policy_loss(cfg, logp, torch.zeros(2, 3), adv, mask)
    s1, s2 = 0.5, (0.4 * 0.8 * 0.2) ** (1 / 3)
    assert float(terms.policy.detach()) == pytest.approx(-(s1 - s2), abs=1e-6)
    terms.total.backward()
    want = [[-s1, 0.0, 0.0], [s2 / 3, s2 / 3, s2 / 3]]
    assert logp.grad.tolist() == [pytest.approx(r, abs=1e-6) for r in want]


def test_gspo_defaults_and_refusals():
    """GSPO gets its paper's clip range and sequence aggregation when unset; a length-weighted aggregation is
    refused (it is not GSPO's objective), a token-sized clip range is warned about (it almost never clips)."""
    cfg = LossConfig(policy_loss="gspo")
    assert (cfg.eps_low, cfg.eps_high, cfg.aggregation) == (3e-4, 4e-4, "seq_mean_token_mean")
    ppo = LossConfig()
    assert (ppo.eps_low, ppo.eps_high, ppo.aggregation) == (0.2, 0.28, "token_mean")
    for agg in ("token_mean", "seq_mean_token_sum_norm"):
        with pytest.raises(ValueError, match="not GSPO's objective"):
            LossConfig(policy_loss="gspo", aggregation=agg)
    with pytest.warns(UserWarning, match="almost never clip"):
        LossConfig(policy_loss="gspo", eps_low=0.2, eps_high=0.28)
    # at the paper's range a sequence ratio of 1.001 is clipped (A > 0): the gradient stops
    logp = torch.log(_t([1.001, 1.001])).requires_grad_()
    terms, stats = policy_loss(cfg, logp, torch.zeros(1, 2), _t([1.0, 1.0]), torch.ones(1, 2))
    terms.total.backward()
    assert stats["clip_high"].tolist() == [1.0, 1.0] and logp.grad.abs().max() == 0


def test_cispo_weights_are_clipped_and_stop_gradient():
    cfg = LossConfig(policy_loss="cispo", eps_low=0.2, eps_high=0.2)
    logp = torch.log(_t([2.0])).requires_grad_()
    terms, _ = policy_loss(cfg, logp, torch.zeros(1, 1), _t([1.0]), torch.ones(1, 1))
    terms.total.backward()
    # loss = -sg(clip(2, 0.8, 1.2))·A·logp → d/dlogp = -1.2 (no gradient through the ratio itself)
    assert float(logp.grad) == pytest.approx(-1.2)
    assert float(terms.policy.detach()) == pytest.approx(-1.2 * math.log(2.0), abs=1e-6)


def test_cispo_clip_metrics_count_both_sides():
    cfg = LossConfig(policy_loss="cispo", eps_low=0.2, eps_high=0.2)
    logp = torch.log(_t([2.0, 0.5, 2.0, 0.5, 1.0]))
    adv = _t([1.0, 1.0, -1.0, -1.0, 1.0])
    _, stats = policy_loss(cfg, logp, torch.zeros(1, 5), adv, torch.ones(1, 5))
    # CISPO clips the weight whatever the sign of A: both r = 2 are high, both r = 0.5 low
    assert stats["clip_high"].tolist() == [1, 0, 1, 0, 0] and stats["clip_low"].tolist() == [0, 1, 0, 1, 0]
    _, ppo = policy_loss(LossConfig(eps_low=0.2, eps_high=0.2), logp, torch.zeros(1, 5), adv, torch.ones(1, 5))
    # PPO's clip is active only where it stops the gradient: r > 1+ε with A > 0, r < 1−ε with A < 0
    assert ppo["clip_high"].tolist() == [1, 0, 0, 0, 0] and ppo["clip_low"].tolist() == [0, 0, 0, 1, 0]


@pytest.mark.filterwarnings("ignore:loss.policy_loss gspo clips")
def test_ppo_cispo_gspo_give_different_gradients_once_old_differs():
    """On policy (π_old = π_θ) the three share the REINFORCE gradient; with π_old ≠ π_θ they differ."""
    logp0 = torch.log(_t([0.5, 0.2, 0.4]))
    old = torch.log(_t([0.3, 0.24, 0.4]))  # ratios 5/3, 5/6, 1
    adv, mask = _t([1.0, -1.0, 1.0]), torch.ones(1, 3)
    # one sequence: every aggregation divides by its 3 tokens; GSPO's objective needs seq_mean_token_mean
    cfgs = {k: LossConfig(policy_loss=k, eps_low=0.2, eps_high=0.2, aggregation="seq_mean_token_mean")
            for k in ("ppo", "cispo", "gspo")}

    def grad(cfg, o):
        logp = logp0.clone().requires_grad_()
        policy_loss(cfg, logp, o, adv, mask)[0].total.backward()
        return logp.grad[0]

    on = {k: grad(c, logp0) for k, c in cfgs.items()}
    assert torch.allclose(on["ppo"], on["cispo"]) and torch.allclose(on["ppo"], on["gspo"])
    off = {k: grad(c, old) for k, c in cfgs.items()}
    # ppo: token 0 clipped (r 5/3 > 1.2, A > 0) → 0; token 1: −A·r = 5/6 (inside); token 2: −1
    assert off["ppo"].tolist() == pytest.approx([0.0, 5 / 18, -1 / 3], abs=1e-5)
    # cispo: −sg(clip(r))·A: (−1.2, 5/6, −1.0), ÷ 3
    assert off["cispo"].tolist() == pytest.approx([-0.4, 5 / 18, -1 / 3], abs=1e-5)
    # gspo: sequence ratio (5/3 · 5/6 · 1)^(1/3) = 1.1157, inside the clip; each token −A·s, ÷ 3
    s = (5 / 3 * 5 / 6) ** (1 / 3)
    assert off["gspo"].tolist() == pytest.approx([-s / 3, s / 3, -s / 3], abs=1e-5)


def test_ratio_statistic_is_exp_of_the_log_ratio():
    logp, old = _t([-1.0, -2.0, -0.5]), _t([-1.5, -1.9, -0.5])
    _, stats = policy_loss(LossConfig(), logp, old, _t([1.0, 1.0, 1.0]), torch.ones(1, 3))
    assert stats["ratio"].tolist() == pytest.approx(torch.exp(logp - old)[0].tolist())


def test_masked_tokens_change_nothing():
    """Changing the logits that predict env (masked) tokens leaves the loss and its gradient unchanged."""
    torch.manual_seed(0)
    ids = torch.randint(0, 11, (1, 6))
    mask = _t([0, 0, 1, 1, 0, 1])  # positions 0-1 prompt, 4 an env token
    adv = mask * 0.7
    base = torch.randn(1, 6, 11)

    def loss_and_grad(logits):
        logits = logits.clone().requires_grad_()
        logp, ent = token_logprobs(logits, ids, mask, with_entropy=True)
        terms, _ = policy_loss(LossConfig(entropy_coef=0.01), logp, logp.detach(), adv, mask, entropy=ent)
        terms.total.backward()
        return float(terms.total.detach()), logits.grad

    l1, g1 = loss_and_grad(base)
    changed = base.clone()
    changed[0, 3] += 50 * torch.randn(11)  # predicts id 4: an env token
    changed[0, 0] -= 30  # predicts id 1: prompt
    l2, g2 = loss_and_grad(changed)
    assert l1 == pytest.approx(l2)
    assert torch.allclose(g1[0, [1, 2, 4]], g2[0, [1, 2, 4]])
    assert g2[0, 3].abs().sum() == 0 and g2[0, 0].abs().sum() == 0


def test_token_logprobs_match_log_softmax():
    torch.manual_seed(1)
    logits = torch.randn(2, 5, 7)
    ids = torch.randint(0, 7, (2, 5))
    mask = torch.ones(2, 5)
    mask[:, 0] = 0
    lp, ent = token_logprobs(logits, ids, mask, with_entropy=True)
    ref = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    assert torch.allclose(lp[:, 1:], ref, atol=1e-6)
    p = torch.softmax(logits[:, :-1], -1)
    assert torch.allclose(ent[:, 1:], -(p * p.log()).sum(-1), atol=1e-5)


def test_log_ratio_is_clamped_before_exp():
    terms, stats = policy_loss(LossConfig(), _t([0.0]), _t([-1000.0]), _t([-1.0]), torch.ones(1, 1))
    assert math.isfinite(float(terms.total)) and math.isfinite(float(stats["ratio"].max()))


def test_kl_and_entropy_are_separate_terms():
    cfg = LossConfig(kl_coef=0.5, kl_estimator="k2", entropy_coef=0.1)
    logp, ref, ent = _t([-1.0, -2.0]), _t([-1.5, -1.0]), _t([2.0, 1.0])
    terms, stats = policy_loss(cfg, logp, logp, _t([1.0, 1.0]), torch.ones(1, 2), ref, ent)
    assert float(terms.policy) == pytest.approx(-2.0)  # −A·r with r = 1
    assert float(terms.kl) == pytest.approx(0.5 * (0.5 * 0.25 + 0.5 * 1.0))  # β·Σ ½(log π − log ref)²
    assert float(terms.entropy) == pytest.approx(-0.1 * 3.0)
    assert float(terms.total) == pytest.approx(float(terms.policy + terms.kl + terms.entropy))
    assert stats["kl"].tolist() == pytest.approx([0.125, 0.5])


# -- KL gradients by exact enumeration over a categorical distribution --------------------------------
THETA = [0.3, -0.2, 1.1, -0.7]
REF = [0.25, 0.25, 0.4, 0.1]


def _expected_kl_grad(estimator: str, old_shift: tuple[float, ...] | None):
    """E_{x~π_old}[∇_θ loss(x)], summed exactly over the four outcomes x (π_old = π_θ unless shifted)."""
    theta = torch.tensor(THETA, requires_grad=True)
    logpi = torch.log_softmax(theta, -1)
    old_logits = torch.tensor(THETA) + (torch.tensor(old_shift) if old_shift else 0.0)
    pi_old = torch.softmax(old_logits, -1)
    cfg = LossConfig(kl_coef=1.0, kl_estimator=estimator, eps_low=0.9, eps_high=10.0)  # no clip in play
    total = 0.0
    for x in range(4):
        logp = logpi[x].reshape(1, 1)
        old = torch.log(pi_old[x]).reshape(1, 1)
        ref = torch.log(torch.tensor(REF[x])).reshape(1, 1)
        terms, _ = policy_loss(cfg, logp, old, torch.zeros(1, 1), torch.ones(1, 1), ref)
        total = total + pi_old[x] * terms.total
    (g,) = torch.autograd.grad(total, theta)
    return g


def _kl_grad(reverse: bool):
    theta = torch.tensor(THETA, requires_grad=True)
    p, q = torch.softmax(theta, -1), torch.tensor(REF)
    kl = (p * (p.log() - q.log())).sum() if reverse else (q * (q.log() - p.log())).sum()
    (g,) = torch.autograd.grad(kl, theta)
    return g


SHIFT = (0.2, -0.1, 0.0, 0.15)


# k1 is a reward penalty fixed at π_old (a reward, not a loss): its gradient is exact on policy only
@pytest.mark.parametrize("estimator, old_shift", [("k1", None), ("k2", None), ("k3", None), ("k2", SHIFT),
                                                  ("k3", SHIFT)])
def test_every_kl_estimator_follows_the_gradient_of_kl_pi_ref(estimator, old_shift):
    """On policy and off policy (samples from a π_old ≠ π_θ), each option's expected gradient is
    ∇ KL(π_θ ‖ π_ref) — not 0 (k1 as a plain loss term) and not ∇ KL(π_ref ‖ π_θ) (k3 as a plain
    loss)."""
    got = _expected_kl_grad(estimator, old_shift)
    assert torch.allclose(got, _kl_grad(reverse=True), atol=1e-6), (got, _kl_grad(reverse=True))
    assert not torch.allclose(got, _kl_grad(reverse=False), atol=1e-3)


def test_k1_is_exact_on_policy_only():
    """k1 is a reward penalty fixed at π_old: its expected gradient is
    Σ π_θ·(log π_old − log π_ref)·∇log π_θ,
    which is ∇KL(π_θ ‖ π_ref) only where π_old = π_θ; after the policy moves (several optimizer steps on one
    batch) it is off by Σ π_θ·(log π_old − log π_θ)·∇log π_θ — what docs/training.md says."""
    got = _expected_kl_grad("k1", SHIFT)
    theta = torch.tensor(THETA, requires_grad=True)
    logpi = torch.log_softmax(theta, -1)
    pi_old = torch.softmax(torch.tensor(THETA) + torch.tensor(SHIFT), -1)
    penalty = (pi_old.log() - torch.log(torch.tensor(REF))).detach()
    (want,) = torch.autograd.grad((logpi.exp().detach() * penalty * logpi).sum(), theta)
    assert torch.allclose(got, want, atol=1e-6)
    exact = _kl_grad(reverse=True)
    assert float((got - exact).norm() / exact.norm()) > 0.05  # biased off policy


def test_the_plain_loss_forms_have_the_wrong_gradients():
    """What the options are not: k1 = log π − log π_ref as a loss has zero expected gradient on policy, and
    k3 as a plain loss (DeepSeekMath, TRL) follows ∇ KL(π_ref ‖ π_θ)."""
    theta = torch.tensor(THETA, requires_grad=True)
    logpi = torch.log_softmax(theta, -1)
    pi = logpi.exp().detach()
    ref = torch.log(torch.tensor(REF))
    k1 = (pi * (logpi - ref)).sum()
    log_r = ref - logpi
    k3 = (pi * (torch.expm1(log_r) - log_r)).sum()
    g1, = torch.autograd.grad(k1, theta, retain_graph=True)
    g3, = torch.autograd.grad(k3, theta)
    assert torch.allclose(g1, torch.zeros(4), atol=1e-7)
    assert torch.allclose(g3, _kl_grad(reverse=False), atol=1e-6)


# -- rollout–training mismatch correction ---------------------------------------------------------------
def test_tis_with_infinite_cap_is_plain_importance_sampling():
    old, roll = _t([-1.0, -2.0, -0.3]), _t([-1.2, -1.5, -0.3])
    mask = torch.ones(1, 3)
    iw = importance_weights(old, roll, mask, "tis", "token", math.inf)
    assert iw.weight[0].tolist() == pytest.approx(torch.exp(old - roll)[0].tolist())
    adv = _t([1.0, -1.0, 2.0])
    terms, _ = policy_loss(LossConfig(), old, old, adv, mask, is_weight=iw.weight)
    assert float(terms.policy) == pytest.approx(float((-adv * torch.exp(old - roll)).sum()), abs=1e-6)
    capped = importance_weights(old, roll, mask, "tis", "token", 1.1)
    assert capped.weight[0].tolist() == pytest.approx([1.1, math.exp(-0.5), 1.0])  # e^0.2 = 1.22 truncated


def test_mis_drops_tokens_and_sequences_outside_the_band():
    old = _t([-1.0, -2.0, -0.3, 0.0], [-1.0, -1.0, 0.0, 0.0])
    roll = _t([-1.0, -1.0, -0.3, 0.0], [-1.1, -0.9, 0.0, 0.0])
    mask = _t([1, 1, 1, 0], [1, 1, 0, 0])
    tok = importance_weights(old, roll, mask, "mis", "token", 2.0)
    # ratios: row 0 (1, e^−1 = 0.37 < 1/2: dropped, 1); row 1 (e^0.1, e^−0.1)
    assert tok.keep[0, :3].tolist() == [1, 0, 1] and tok.keep[1, :2].tolist() == [1, 1]
    assert tok.weight[1, :2].tolist() == pytest.approx([math.exp(0.1), math.exp(-0.1)])
    seq = importance_weights(old, roll, mask, "mis", "sequence", 2.0)
    # sequence ratios: row 0 e^−1 → dropped whole; row 1 e^0 = 1 → kept with weight 1
    assert seq.keep[0].tolist() == [0, 0, 0, 0] and seq.weight[1, :2].tolist() == pytest.approx([1.0, 1.0])
    geo = importance_weights(old, roll, mask, "tis", "geometric", 2.0)
    assert geo.weight[0, :3].tolist() == pytest.approx([math.exp(-1 / 3)] * 3)


@pytest.mark.parametrize("bad", [{"policy_loss": "ppo2"}, {"eps_low": 1.5}, {"dual_clip": 0.5},
                                 {"aggregation": "mean"}, {"kl_estimator": "k4"}, {"rollout_is": "is"},
                                 {"rollout_is_cap": 0.5}, {"rollout_is_level": "turn"}, {"kl_coef": -0.1},
                                 {"entropy_coef": -1.0}, {"rollout_is_cap": float("nan")}])
def test_bad_loss_config_is_refused(bad):
    with pytest.raises(ValueError):
        LossConfig(**bad)


@pytest.mark.parametrize("chunk", [2, 1024])
def test_chunked_logprobs_divide_bf16_logits_by_the_temperature_in_fp32(chunk):
    """A bf16 model's head returns bf16 logits; dividing them by T = 0.7 in bf16 would round each logit to
    8 bits of mantissa again (~1e-2 at logits ~5). Logprobs and entropies are those of fp32(logits) / T."""
    from sleuth.training.rl.losses import chunked_logprobs

    torch.manual_seed(0)
    hidden = torch.randn(5, 8, dtype=torch.bfloat16)
    w = torch.randn(8, 50, dtype=torch.bfloat16) * 2

    def head(h):
        return h @ w

    ids = torch.randint(0, 50, (1, 6))
    mask = torch.tensor([[0.0, 1, 1, 1, 1, 1]])
    lp, ent = chunked_logprobs(hidden, head, 0.7, ids, mask, with_entropy=True, chunk=chunk)
    logsm = torch.log_softmax(head(hidden).float() / 0.7, dim=-1)
    expected = logsm.gather(-1, ids[0, 1:, None])[:, 0]
    torch.testing.assert_close(lp[0, 1:], expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(ent[0, 1:], -(logsm.exp() * logsm).sum(-1), rtol=0, atol=1e-5)
    in_bf16 = torch.log_softmax((head(hidden) / 0.7).float(), dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
    assert (in_bf16 - expected).abs().max() > 1e-3  # the rounding the test guards against is real here


def test_log_ratio_clamp_is_counted():
    """A token whose log-ratio passes ±LOG_RATIO_CLAMP gets a clamped (wrong) ratio: the stat says where."""
    from sleuth.training.rl.losses import LOG_RATIO_CLAMP

    logp = _t([-1.0, -1.0, -1.0])
    old = _t([-1.0, -1.0 - LOG_RATIO_CLAMP - 5, -1.0 + LOG_RATIO_CLAMP + 1])
    _, stats = policy_loss(LossConfig(), logp, old, _t([1.0, 1.0, 1.0]), torch.ones(1, 3))
    assert stats["log_ratio_clamped"].tolist() == [0.0, 1.0, 1.0]
