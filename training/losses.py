"""Token-level policy-gradient losses over the loss mask, in fp32.

All per-token tensors are (batch, length) and aligned with the input ids: position t holds the value for
predicting id t (position 0 is never a policy token). The mask is the trajectory's loss mask (policy
tokens only), never the attention mask. Losses return a *numerator*; the trainer divides by a
denominator counted over the whole update batch (every micro-batch, every rank), so gradient
accumulation and data parallelism give the same gradient as one big batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

LOG_RATIO_CLAMP = 20.0  # |log ratio| is clamped before exp: e^20 ≈ 5e8 is already far outside any clip range
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
POLICY_LOSSES = ("ppo", "gspo", "cispo")
KL_ESTIMATORS = ("k1", "k2", "k3")


@dataclass
class LossConfig:
    # ppo (token ratio) | gspo (sequence ratio; the paper pairs it with seq_mean_token_mean) | cispo
    policy_loss: str = "ppo"
    eps_low: float = 0.2
    eps_high: float = 0.28  # DAPO's clip-higher default
    dual_clip: float | None = None  # c > 1: caps the loss of negative-advantage tokens at c·|A| (Ye et al. 2020)
    kl_coef: float = 0.0  # > 0 loads a frozen reference model
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    aggregation: str = "token_mean"
    norm_length: int = 1024  # the constant of `seq_mean_token_sum_norm` (Dr.GRPO): a max response length

    def __post_init__(self) -> None:
        _choice("loss.policy_loss", self.policy_loss, POLICY_LOSSES)
        _choice("loss.kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        _choice("loss.aggregation", self.aggregation, AGGREGATIONS)
        if not (0 <= self.eps_low < 1 and self.eps_high >= 0):
            raise ValueError(f"loss.eps_low must be in [0, 1) and eps_high ≥ 0, got {self.eps_low}, {self.eps_high}")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(f"loss.dual_clip must be > 1, got {self.dual_clip}")
        if self.norm_length <= 0:
            raise ValueError("loss.norm_length must be positive")


def _choice(key: str, value: str, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ValueError(f"{key} must be one of {', '.join(options)}; got {value!r}")


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor,
                   with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probability (and entropy) of each masked token under `logits`, computed in fp32 on the masked
    positions only (a 49k-vocabulary log-softmax over every position would dominate memory)."""
    sel = mask[:, 1:].bool()
    picked = logits[:, :-1][sel].float()  # (n, vocab): the logits that predict each masked token
    logsm = torch.log_softmax(picked, dim=-1)
    lp = logsm.gather(-1, input_ids[:, 1:][sel].unsqueeze(-1)).squeeze(-1)
    out = torch.zeros(mask.shape, dtype=torch.float32, device=logits.device)
    out[:, 1:][sel] = lp
    ent = None
    if with_entropy:
        ent = torch.zeros_like(out)
        ent[:, 1:][sel] = -(logsm.exp() * logsm).sum(-1)
    return out, ent


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL(π ‖ π_ref) estimates from samples of π (Schulman, "Approximating KL divergence", 2020)."""
    log_r = (ref_logp - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r**2
    if estimator == "k3":
        return torch.expm1(log_r) - log_r
    raise ValueError(f"unknown KL estimator {estimator!r}")


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, norm_length: int) -> torch.Tensor:
    """The numerator of the aggregated loss for this micro-batch (see `denominator`)."""
    masked = per_token * mask
    if mode == "token_mean":
        return masked.sum()
    if mode == "seq_mean_token_mean":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1)).sum()
    if mode == "seq_mean_token_sum_norm":
        return masked.sum() / norm_length
    raise ValueError(f"unknown aggregation {mode!r}")


def denominator(mask: torch.Tensor, mode: str) -> float:
    """What the summed numerators are divided by: policy tokens for `token_mean`, sequences that hold
    at least one policy token for the sequence-level modes."""
    if mode == "token_mean":
        return float(mask.sum())
    return float((mask.sum(-1) > 0).sum())


def policy_loss(cfg: LossConfig, logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor,
                mask: torch.Tensor, ref_logp: torch.Tensor | None = None, entropy: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, dict[str, Any]]:
    """(loss numerator, per-token statistics for metrics). `adv` is per token (0 off the mask)."""
    log_ratio = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    lo, hi = 1.0 - cfg.eps_low, 1.0 + cfg.eps_high
    if cfg.policy_loss == "gspo":
        # Zheng et al. 2025: the ratio is the geometric mean of the sequence's token ratios; the token form
        # sg[s]·π/sg[π] has the sequence ratio's value and gradient while keeping per-token aggregation.
        seq = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        log_ratio = seq.detach().unsqueeze(-1) + logp - logp.detach()
    ratio = torch.exp(log_ratio)
    if cfg.policy_loss == "cispo":
        # MiniMax-M1 2025: REINFORCE weighted by the clipped, stop-gradient importance ratio.
        per_tok = -ratio.clamp(lo, hi).detach() * adv * logp
    else:
        per_tok = torch.maximum(-adv * ratio, -adv * ratio.clamp(lo, hi))
        if cfg.dual_clip is not None:
            per_tok = torch.where(adv < 0, torch.minimum(per_tok, -adv * cfg.dual_clip), per_tok)
    if ref_logp is not None and cfg.kl_coef > 0:
        kl = kl_penalty(logp, ref_logp, cfg.kl_estimator)
        per_tok = per_tok + cfg.kl_coef * kl
    else:
        kl = None
    if entropy is not None and cfg.entropy_coef > 0:
        per_tok = per_tok - cfg.entropy_coef * entropy
    loss = aggregate(per_tok, mask, cfg.aggregation, cfg.norm_length)
    m = mask.bool()
    r = ratio.detach()[m]
    a = adv[m]
    stats = {
        "ratio": r,
        "clip_low": ((r < lo) & (a < 0)).float(),
        "clip_high": ((r > hi) & (a > 0)).float(),
        "kl": kl.detach()[m] if kl is not None else None,
        "entropy": entropy.detach()[m] if entropy is not None else None,
    }
    return loss, stats
