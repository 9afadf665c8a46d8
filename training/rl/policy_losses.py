"""Policy losses by name (`loss.policy_loss`), one registry like the advantage estimators': a loss is a
`PolicyLoss` subclass registered with `POLICY_LOSSES.register(name, cls)`, or by another package under the
entry-point group `sleuth.policy_losses`. `losses.policy_loss` runs the one chosen; the KL and entropy terms, the
importance weights and the aggregation are the same for every loss."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from sleuth.core.registry import Registry


@dataclass
class PerToken:
    """A loss's per-token numerator and where its clip stopped the gradient (for the clip-fraction metrics)."""

    loss: torch.Tensor
    clip_low: torch.Tensor
    clip_high: torch.Tensor
    clip_dual: torch.Tensor


class PolicyLoss(ABC):
    """One policy-gradient objective over the ratio π_θ / π_old and per-token advantages."""

    # (eps_low, eps_high, aggregation) when the config leaves them unset
    defaults: ClassVar[tuple[float, float, str]] = (0.2, 0.28, "token_mean")

    def check(self, cfg: Any) -> None:
        """Refuse (ValueError) or warn about settings of `loss:` this objective does not mean; none by default."""
        return None

    def log_ratio(self, log_ratio: torch.Tensor, logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The log ratio the objective clips: the token's own by default."""
        return log_ratio

    @abstractmethod
    def per_token(self, ratio: torch.Tensor, adv: torch.Tensor, logp: torch.Tensor, lo: float, hi: float,
                  dual_clip: float | None) -> PerToken: ...


class PPO(PolicyLoss):
    """PPO's clipped surrogate, max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)); with `dual_clip` c, the loss of a
    negative-advantage token is capped at c·|A| (Ye et al. 2020). DAPO's clip-higher defaults 0.2 / 0.28."""

    def per_token(self, ratio: torch.Tensor, adv: torch.Tensor, logp: torch.Tensor, lo: float, hi: float,
                  dual_clip: float | None) -> PerToken:
        r = ratio.detach()
        loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(lo, hi))
        clip_dual = torch.zeros_like(r, dtype=torch.bool)
        if dual_clip is not None:
            clip_dual = (adv < 0) & (r > dual_clip)
            loss = torch.where(adv < 0, torch.minimum(loss, -adv * dual_clip), loss)
        return PerToken(loss, (r < lo) & (adv < 0), (r > hi) & (adv > 0), clip_dual)


GSPO_WIDE_EPS = 0.01  # a sequence-ratio clip wider than this almost never fires


class GSPO(PPO):
    """GSPO (Zheng et al. 2025, arXiv 2507.18071): PPO's clip on the geometric mean of the sequence's token
    ratios; the token form sg[s]·π/sg[π] has the sequence ratio's value and gradient while keeping per-token
    aggregation. Its paper clips at 3e-4 / 4e-4 and averages each sequence's token mean."""

    defaults = (3e-4, 4e-4, "seq_mean_token_mean")

    def check(self, cfg: Any) -> None:
        import warnings

        if cfg.aggregation != "seq_mean_token_mean":
            raise ValueError(f"loss.policy_loss gspo optimises a mean over sequences of each sequence's token "
                             f"mean; loss.aggregation {cfg.aggregation} weights sequences by length, which is "
                             "not GSPO's objective: use seq_mean_token_mean (or leave it unset)")
        if max(cfg.eps_low, cfg.eps_high) > GSPO_WIDE_EPS:
            warnings.warn(f"loss.policy_loss gspo clips a sequence's geometric-mean ratio, which rarely leaves "
                          f"1 ± {GSPO_WIDE_EPS}: eps_low {cfg.eps_low} / eps_high {cfg.eps_high} will almost "
                          "never clip (GSPO's paper uses 3e-4 / 4e-4, the defaults when unset)", stacklevel=4)

    def log_ratio(self, log_ratio: torch.Tensor, logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        seq = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        return seq.detach().unsqueeze(-1) + logp - logp.detach()


class CISPO(PolicyLoss):
    """CISPO (MiniMax-M1 2025): REINFORCE weighted by the clipped, stop-gradient importance ratio; the weight is
    clipped on either side whatever the sign of A."""

    def per_token(self, ratio: torch.Tensor, adv: torch.Tensor, logp: torch.Tensor, lo: float, hi: float,
                  dual_clip: float | None) -> PerToken:
        r = ratio.detach()
        return PerToken(-r.clamp(lo, hi) * adv * logp, r < lo, r > hi, torch.zeros_like(r, dtype=torch.bool))


POLICY_LOSSES: Registry[type[PolicyLoss]] = Registry("policy loss", group="sleuth.policy_losses")
POLICY_LOSSES.register("ppo", PPO, "sleuth")
POLICY_LOSSES.register("gspo", GSPO, "sleuth")
POLICY_LOSSES.register("cispo", CISPO, "sleuth")


def policy_loss_named(name: str) -> PolicyLoss:
    """The registered policy loss `name`, built (an unknown name says the closest one)."""
    cls = POLICY_LOSSES.get(name)
    if not (isinstance(cls, type) and issubclass(cls, PolicyLoss)):
        raise ValueError(f"policy loss {name!r} is a {type(cls).__name__}, not a PolicyLoss subclass")
    return cls()
