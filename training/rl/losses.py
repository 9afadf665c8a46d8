"""Token-level policy-gradient losses over the loss mask, in fp32.

All per-token tensors are (batch, length) and aligned with the input ids: position t holds the value for
predicting id t (position 0 is never a policy token). The mask is the trajectory's loss mask (policy
tokens only), never the attention mask. Losses return *numerators*; the trainer divides by a
denominator counted over the whole optimizer step's mini-batch (every micro-batch, every rank), so
gradient accumulation and data parallelism give the same gradient as one big batch.

Three policies appear: π_θ (being optimised; `logp`), π_old (the policy the ratio is taken against:
the pre-update trainer policy, recomputed, or the rollout engine's; `old_logp`) and π_rollout (the engine
that sampled the tokens; its logprobs correct the rollout–training mismatch through `importance_weights`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from sleuth.training.rl.policy_losses import policy_loss_named

LOG_RATIO_CLAMP = 20.0  # |log ratio| is clamped before exp: e^20 ≈ 5e8 is already far outside any clip range
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
KL_ESTIMATORS = ("k1", "k2", "k3")
ROLLOUT_IS = ("none", "tis", "mis")
ROLLOUT_IS_LEVELS = ("token", "sequence", "geometric")



@dataclass
class LossConfig:
    policy_loss: str = "ppo"  # a registered PolicyLoss (`policy_losses.POLICY_LOSSES`): ppo | gspo | cispo | a plugin
    eps_low: float | None = None  # None: the policy loss's own default (`PolicyLoss.defaults`)
    eps_high: float | None = None
    dual_clip: float | None = None  # c > 1: caps the loss of negative-advantage tokens at c·|A| (Ye et al. 2020)
    kl_coef: float = 0.0  # > 0 loads a frozen reference model
    kl_estimator: str = "k3"  # k2, k3: ∇KL(π_θ ‖ π_ref) on and off policy; k1: on policy only (see `kl_loss`)
    entropy_coef: float = 0.0
    aggregation: str | None = None  # None: the policy loss's own (gspo: seq_mean_token_mean, else token_mean)
    norm_length: int = 1024  # the constant of `seq_mean_token_sum_norm` (Dr.GRPO): a max response length
    # Rollout–training mismatch correction (needs update.old_logprobs: recompute): none | tis | mis
    rollout_is: str = "none"
    rollout_is_level: str = "token"  # token | sequence (product of token ratios) | geometric (their mean in log)
    rollout_is_cap: float = 2.0  # C ≥ 1: TIS truncates the weight at C; MIS keeps ratios in [1/C, C]

    def __post_init__(self) -> None:
        objective = policy_loss_named(self.policy_loss)
        eps_low, eps_high, aggregation = objective.defaults
        self.eps_low = eps_low if self.eps_low is None else self.eps_low
        self.eps_high = eps_high if self.eps_high is None else self.eps_high
        self.aggregation = aggregation if self.aggregation is None else self.aggregation
        _choice("loss.kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        _choice("loss.aggregation", self.aggregation, AGGREGATIONS)
        objective.check(self)
        _choice("loss.rollout_is", self.rollout_is, ROLLOUT_IS)
        _choice("loss.rollout_is_level", self.rollout_is_level, ROLLOUT_IS_LEVELS)
        # eps_low 1 (a lower bound of 0, which no ratio reaches) and eps_high inf turn a side's clip off
        if not (0 <= self.eps_low <= 1 and self.eps_high >= 0):
            raise ValueError(f"loss.eps_low must be in [0, 1] and eps_high ≥ 0, got {self.eps_low}, {self.eps_high}")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(f"loss.dual_clip must be > 1, got {self.dual_clip}")
        if self.norm_length <= 0:
            raise ValueError("loss.norm_length must be positive")
        if not (self.kl_coef >= 0 and self.entropy_coef >= 0):
            raise ValueError(f"loss.kl_coef and loss.entropy_coef must be ≥ 0, got {self.kl_coef}, "
                             f"{self.entropy_coef}")
        if not self.rollout_is_cap >= 1:  # also refuses NaN
            raise ValueError(f"loss.rollout_is_cap must be ≥ 1 (inf allowed), got {self.rollout_is_cap}")


def _choice(key: str, value: str, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ValueError(f"{key} must be one of {', '.join(options)}; got {value!r}")


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor,
                   with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probability (and entropy) of each masked token under full (B, L, V) `logits`."""
    return scored_logprobs(logits[:, :-1][mask[:, 1:].bool()], input_ids, mask, with_entropy)


def scored_logprobs(scored: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor,
                    with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probability (and entropy) of each masked token, as (B, L) tensors that are 0 off the mask.

    `scored` (n, V) holds the logits of the n positions that predict a masked token, in the row-major order
    of `mask[:, 1:]` (position t − 1 predicts token t). The log-softmax runs in fp32 on those rows only: a
    49k-vocabulary log-softmax over every position would dominate memory."""
    sel = mask[:, 1:].bool()
    logsm = torch.log_softmax(scored.float(), dim=-1)
    lp = logsm.gather(-1, input_ids[:, 1:][sel].unsqueeze(-1)).squeeze(-1)
    out = torch.zeros(mask.shape, dtype=torch.float32, device=scored.device)
    out[:, 1:][sel] = lp
    ent = None
    if with_entropy:
        ent = torch.zeros_like(out)
        ent[:, 1:][sel] = -(logsm.exp() * logsm).sum(-1)
    return out, ent


def chunked_logprobs(hidden: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], temperature: float,
                     input_ids: torch.Tensor, mask: torch.Tensor, with_entropy: bool = False,
                     chunk: int = 1024) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`scored_logprobs` of head(`hidden`) / temperature, `chunk` positions at a time. `hidden` (n, H) holds
    the last hidden states of the scored positions (order as in `scored_logprobs`). Where more than one
    chunk needs gradients, each chunk's head, log-softmax and entropy are recomputed in the backward pass
    instead of kept (non-reentrant activation checkpointing): the memory of the (n, V) fp32 logits, their
    log-softmax and its exponential becomes one chunk's, at the cost of a second head matmul per chunk."""
    sel = mask[:, 1:].bool()
    targets = input_ids[:, 1:][sel]

    def part(h: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logsm = torch.log_softmax(head(h).float() / temperature, dim=-1)  # T in fp32: bf16 logits / T round
        lp = logsm.gather(-1, t.unsqueeze(-1)).squeeze(-1)
        ent = -(logsm.exp() * logsm).sum(-1) if with_entropy else lp.new_zeros(lp.shape)
        return lp, ent

    n = hidden.shape[0]
    recompute = torch.is_grad_enabled() and hidden.requires_grad and n > chunk
    lps, ents = [], []
    for i in range(0, max(n, 1), chunk):
        args = (hidden[i:i + chunk], targets[i:i + chunk])
        lp, ent = checkpoint(part, *args, use_reentrant=False) if recompute else part(*args)
        lps.append(lp)
        ents.append(ent)
    out = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device)
    out[:, 1:][sel] = torch.cat(lps)
    if not with_entropy:
        return out, None
    ent_out = torch.zeros_like(out)
    ent_out[:, 1:][sel] = torch.cat(ents)
    return out, ent_out


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token *values* of Schulman's estimators of KL(π ‖ π_ref) from samples of π ("Approximating KL
    divergence", 2020), for metrics: k1 = −log r, k2 = ½(log r)², k3 = r − 1 − log r, r = π_ref/π."""
    log_r = (ref_logp - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r**2
    if estimator == "k3":
        return torch.expm1(log_r) - log_r
    raise ValueError(f"unknown KL estimator {estimator!r}")


def kl_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor | None:
    """A per-token loss whose gradient, in expectation over tokens sampled from π_old, is ∇_θ KL(π_θ ‖ π_ref)
    at each visited position (the per-position KL that GRPO-style trainers regularise, not the sequence KL,
    whose gradient would also need the sum over future tokens). Following the analysis of Tang & Munos 2025
    ("On a few pitfalls in KL divergence gradient estimation for RL") and Liu et al. 2025 ("On the design of
    KL-regularized policy gradient algorithms for LLM reasoning"), with ρ = π_θ/π_old:

    - `k2`: sg(ρ)·½(log π_θ − log π_ref)²: ∇ = sg(ρ)(log π_θ − log π_ref)∇log π_θ, the
      score-function form;
    - `k3`: ρ·k3 with ρ carrying the gradient: ∇E_{π_old}[ρ·k3] = ∇E_{π_θ}[k3] = ∇KL(π_θ ‖ π_ref).
      (k3 alone as a loss, as in DeepSeekMath, TRL and verl's `low_var_kl`, has the gradient of
      KL(π_ref ‖ π_θ).)
    - `k1`: None: k1 is no loss term (its pathwise gradient ∇log π has zero mean on policy). It enters as a
      reward penalty instead, A ← A − β·(log π_old − log π_ref) per token (`policy_loss`), which gives the
      same score-function gradient through the surrogate on policy only: fixed at π_old, it drifts from
      ∇KL(π_θ ‖ π_ref) once π_θ has moved (a second optimizer step on the batch, stale samples).
    """
    if estimator == "k1":
        return None
    if estimator == "k2":
        ratio = torch.exp((logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)).detach()
        return ratio * 0.5 * (logp - ref_logp) ** 2
    if estimator == "k3":
        ratio = torch.exp((logp - old_logp.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        return ratio * kl_penalty(logp, ref_logp, "k3")
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


@dataclass
class ImportanceWeights:
    weight: torch.Tensor  # (B, L) detached per-token weight of the policy-gradient term (1 where uncorrected)
    keep: torch.Tensor  # (B, L) 1 where the token stays in the loss (MIS drops the rest, denominators too)
    ratio: torch.Tensor  # (n,) the raw π_old/π_rollout ratio at the chosen level, one per masked token


def importance_weights(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, mode: str,
                       level: str, cap: float) -> ImportanceWeights:
    """Rollout–training mismatch correction: the tokens were sampled by π_rollout, the loss is taken
    against π_old. `tis` (truncated IS; Yao et al. 2025, "Your efficient RL framework secretly brings you
    off-policy RL training") weights each token by min(π_old/π_rollout, C); `mis` (masked IS; Liu, Li et al.
    2025, "When speed kills stability") keeps the true ratio where it lies in [1/C, C] and drops the token
    (or the whole sequence, at sequence levels) elsewhere. `sequence` uses the product of the sequence's
    token ratios, `geometric` their geometric mean."""
    log_w = ((old_logp - rollout_logp) * mask).detach()
    if level != "token":
        seq = log_w.sum(-1)
        if level == "geometric":
            seq = seq / mask.sum(-1).clamp(min=1)
        log_w = seq.unsqueeze(-1).expand_as(mask)
    w = torch.exp(log_w.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    m = mask.bool()
    keep = torch.ones_like(mask)
    if mode == "tis":
        weight = w.clamp(max=cap) if math.isfinite(cap) else w
    elif mode == "mis":
        inside = (w >= 1.0 / cap) & (w <= cap)
        keep = inside.to(mask.dtype)
        weight = torch.where(inside, w, torch.zeros_like(w))
    elif mode == "none":
        weight = torch.ones_like(w)
    else:
        raise ValueError(f"unknown rollout IS mode {mode!r}")
    return ImportanceWeights(weight * mask, keep, w[m])


@dataclass
class LossTerms:
    """Loss numerators of one micro-batch, kept apart so each is logged on its own."""
    policy: torch.Tensor
    kl: torch.Tensor
    entropy: torch.Tensor  # already carries −entropy_coef

    @property
    def total(self) -> torch.Tensor:
        return self.policy + self.kl + self.entropy


def policy_loss(cfg: LossConfig, logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor,
                mask: torch.Tensor, ref_logp: torch.Tensor | None = None, entropy: torch.Tensor | None = None,
                is_weight: torch.Tensor | None = None) -> tuple[LossTerms, dict[str, Any]]:
    """(loss numerators, per-token statistics for metrics). `adv` is per token (0 off the mask); `is_weight`
    (detached, from `importance_weights`) multiplies the policy-gradient term only, as verl does."""
    raw_log_ratio = logp - old_logp
    log_ratio = raw_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    lo, hi = 1.0 - cfg.eps_low, 1.0 + cfg.eps_high
    use_kl = ref_logp is not None and cfg.kl_coef > 0
    kl_value = kl_penalty(logp, ref_logp, cfg.kl_estimator).detach() if use_kl else None
    if use_kl and cfg.kl_estimator == "k1":  # KL as a per-token reward penalty, fixed at π_old
        adv = adv - cfg.kl_coef * (old_logp - ref_logp).detach() * mask
    objective = policy_loss_named(cfg.policy_loss)
    ratio = torch.exp(objective.log_ratio(log_ratio, logp, mask))
    r = ratio.detach()
    out = objective.per_token(ratio, adv, logp, lo, hi, cfg.dual_clip)
    per_tok, clip_low, clip_high, clip_dual = out.loss, out.clip_low, out.clip_high, out.clip_dual
    if is_weight is not None:
        per_tok = per_tok * is_weight
    zero = logp.new_zeros(())
    kl_num = zero
    if use_kl:
        kl_tok = kl_loss(logp, old_logp, ref_logp, cfg.kl_estimator)
        if kl_tok is not None:
            kl_num = cfg.kl_coef * aggregate(kl_tok, mask, cfg.aggregation, cfg.norm_length)
    ent_num = zero
    if entropy is not None and cfg.entropy_coef > 0:
        ent_num = -cfg.entropy_coef * aggregate(entropy, mask, cfg.aggregation, cfg.norm_length)
    terms = LossTerms(aggregate(per_tok, mask, cfg.aggregation, cfg.norm_length), kl_num, ent_num)
    m = mask.bool()
    stats = {
        "ratio": r[m],
        "clip_low": clip_low[m].float(),
        "clip_high": clip_high[m].float(),
        "clip_dual": clip_dual[m].float(),
        "log_ratio_clamped": (raw_log_ratio.detach()[m].abs() > LOG_RATIO_CLAMP).float(),
        "kl": kl_value[m] if kl_value is not None else None,
        "entropy": entropy.detach()[m] if entropy is not None else None,
    }
    return terms, stats
