"""Policy losses by name (`training/rl/policy_losses.py`): a plugin's loss is picked by `loss.policy_loss` like the
shipped ones (PPO, GSPO and CISPO are checked by hand in tests/test_losses.py)."""

import math

import pytest
import torch

from sleuth.training.rl.losses import LossConfig, policy_loss


def test_a_registered_policy_loss_is_picked_by_name_with_its_defaults_and_gradient():
    """A plugin's loss (plain REINFORCE, −A·log π over the mask, token mean) through `POLICY_LOSSES`: the config
    takes its name and its own defaults, an unknown name is refused with the closest one, and the loss and its
    gradient are the hand-computed ones (no ratio; a numerator, so a token's gradient is −A, and 0 off the mask)."""
    from sleuth.core.errors import ConfigError
    from sleuth.training.config import load_config
    from sleuth.training.rl.policy_losses import POLICY_LOSSES, PerToken, PolicyLoss

    class Reinforce(PolicyLoss):
        defaults = (1.0, math.inf, "token_mean")  # no clip at all

        def per_token(self, ratio, adv, logp, lo, hi, dual_clip):
            none = torch.zeros_like(ratio, dtype=torch.bool)
            return PerToken(-adv * logp, none, none, none)

    POLICY_LOSSES.register("reinforce_test", Reinforce)
    try:
        cfg = LossConfig(policy_loss="reinforce_test")
        assert (cfg.eps_low, cfg.eps_high, cfg.aggregation) == (1.0, math.inf, "token_mean")
        assert load_config(overrides={"loss.policy_loss": "reinforce_test"}).loss.policy_loss == "reinforce_test"
        with pytest.raises(ConfigError, match="did you mean 'reinforce_test'"):
            load_config(overrides={"loss.policy_loss": "reinforce_tset"})
        logp = torch.tensor([[0.0, -1.0, -2.0, -0.5]], requires_grad=True)
        old = torch.tensor([[0.0, -3.0, -0.1, -0.5]])  # far from logp: a clipped loss would differ
        adv = torch.tensor([[0.0, 2.0, -1.0, 0.0]])
        mask = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
        terms, _ = policy_loss(cfg, logp, old, adv, mask)
        assert terms.policy.item() == pytest.approx(-(2.0 * -1.0 + -1.0 * -2.0))  # a numerator: summed over the mask
        terms.total.backward()
        assert logp.grad.tolist() == [[0.0, -2.0, 1.0, 0.0]]
    finally:
        POLICY_LOSSES.unregister("reinforce_test")
