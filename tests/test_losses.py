"""Policy-loss math against hand-computed numbers."""

import math

import pytest
import torch

from sleuth.training.losses import LossConfig, aggregate, denominator, kl_penalty, policy_loss, token_logprobs


def _t(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_ppo_clip_with_separate_low_and_high():
    cfg = LossConfig(eps_low=0.2, eps_high=0.3)
    # ratios e^Δ: 1.5 (A>0: clipped at 1.3), 0.5 (A<0: clipped at 0.8), 1.1 (A>0: inside)
    old = torch.zeros(1, 3)
    logp = torch.log(_t([1.5, 0.5, 1.1]))
    adv = _t([2.0, -1.0, 1.0])
    mask = torch.ones(1, 3)
    num, stats = policy_loss(cfg, logp, old, adv, mask)
    # per token: max(-A r, -A clip(r)) = [-2.6, 0.8, -1.1]; token_mean numerator = sum = -2.9
    assert float(num) == pytest.approx(-2.9, abs=1e-5)
    assert stats["clip_high"].tolist() == [1.0, 0.0, 0.0]
    assert stats["clip_low"].tolist() == [0.0, 1.0, 0.0]


def test_dual_clip_caps_negative_advantage_loss():
    cfg = LossConfig(eps_low=0.2, eps_high=0.2, dual_clip=3.0)
    logp = torch.log(_t([10.0, 10.0]))
    num, _ = policy_loss(cfg, logp, torch.zeros(1, 2), _t([-1.0, 1.0]), torch.ones(1, 2))
    # A=-1, r=10: plain PPO gives 10, dual clip caps at 3; A=+1, r=10: -min(10, 1.2) = -1.2
    assert float(num) == pytest.approx(3.0 - 1.2, abs=1e-5)


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
    cfg = LossConfig(policy_loss="gspo", eps_low=0.5, eps_high=0.5)
    logp = torch.log(_t([2.0, 0.5])).requires_grad_()
    num, stats = policy_loss(cfg, logp, torch.zeros(1, 2), _t([1.0, 1.0]), torch.ones(1, 2))
    # geometric mean of 2 and 0.5 is 1: both tokens carry ratio 1 and the sequence gradient
    assert stats["ratio"].tolist() == pytest.approx([1.0, 1.0])
    num.backward()
    assert logp.grad[0].tolist() == pytest.approx([-1.0, -1.0])  # ÷|y| comes from seq_mean_token_mean


def test_cispo_weights_are_clipped_and_stop_gradient():
    cfg = LossConfig(policy_loss="cispo", eps_low=0.2, eps_high=0.2)
    logp = torch.log(_t([2.0])).requires_grad_()
    num, _ = policy_loss(cfg, logp, torch.zeros(1, 1), _t([1.0]), torch.ones(1, 1))
    num.backward()
    # loss = -sg(clip(2, 0.8, 1.2))·A·logp → d/dlogp = -1.2 (no gradient through the ratio itself)
    assert float(logp.grad) == pytest.approx(-1.2)
    assert float(num) == pytest.approx(-1.2 * math.log(2.0), abs=1e-6)


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
        num, _ = policy_loss(LossConfig(entropy_coef=0.01), logp, logp.detach(), adv, mask, entropy=ent)
        num.backward()
        return float(num), logits.grad

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
    num, stats = policy_loss(LossConfig(), _t([0.0]), _t([-1000.0]), _t([-1.0]), torch.ones(1, 1))
    assert math.isfinite(float(num)) and math.isfinite(float(stats["ratio"].max()))


@pytest.mark.parametrize("bad", [{"policy_loss": "ppo2"}, {"eps_low": 1.5}, {"dual_clip": 0.5},
                                 {"aggregation": "mean"}, {"kl_estimator": "k4"}])
def test_bad_loss_config_is_refused(bad):
    with pytest.raises(ValueError):
        LossConfig(**bad)
