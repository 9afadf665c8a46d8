"""Tinker's built-in losses, computed with sleuth's own loss module.

Tinker's contract (tinker-docs.thinkingmachines.ai/tinker/losses): each datum's `loss_fn_inputs` are aligned with
its `model_input` (position i holds the target token predicted at i), and every loss is a *sum* over tokens and
datums (the client chooses its normalisation through `weights` / `advantages`). With q the sampler's logprobs,
p_θ the trainer's and A the advantages:
- cross_entropy: −Σ w·log p_θ;
- importance_sampling: −Σ A·p_θ/q;
- ppo: −Σ min(A·p_θ/q, A·clip(p_θ/q, lo, hi)), lo / hi from `clip_low_threshold` / `clip_high_threshold`
  (0.8 / 1.2 when unset);
- cispo: −Σ sg(clip(p_θ/q, lo, hi))·A·log p_θ.
The policy-gradient ones are sleuth's `policy_loss` (PPO with both clips off is importance sampling) whose
`token_mean` numerator is exactly that sum. DRO, GSPO and stable_reinforce are refused in one line: sleuth has
no loss of their form to check them against."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from sleuth.core.errors import BadInput
from sleuth.training.rl.losses import LossConfig, policy_loss

SUPPORTED = ("cross_entropy", "importance_sampling", "ppo", "cispo")
CLIP_DEFAULTS = (0.8, 1.2)  # Tinker's clip_low_threshold / clip_high_threshold when the config leaves them out
REQUIRED = {"cross_entropy": ("target_tokens", "weights"), "importance_sampling": ("target_tokens", "logprobs",
            "advantages"), "ppo": ("target_tokens", "logprobs", "advantages"),
            "cispo": ("target_tokens", "logprobs", "advantages")}


class LossInputError(BadInput):
    """A loss or its inputs this server cannot compute: the message names what to change."""


@dataclass
class LossBatch:
    """A micro-batch of datums, right-padded to (B, L): `mask` is 1 on each datum's own positions."""
    target_logprobs: torch.Tensor  # log p_θ(target token) at each position (carries the graph)
    mask: torch.Tensor
    weights: torch.Tensor | None = None
    sampling_logprobs: torch.Tensor | None = None
    advantages: torch.Tensor | None = None


def check_loss(loss_fn: str, config: dict[str, float | str]) -> None:
    if loss_fn not in SUPPORTED:
        raise LossInputError(f"loss_fn {loss_fn!r} is not served here; use one of {', '.join(SUPPORTED)} or "
                             "forward_backward_custom (its loss runs in the client)")
    unknown = set(config) - ({"clip_low_threshold", "clip_high_threshold"} if loss_fn in ("ppo", "cispo") else set())
    if unknown:
        raise LossInputError(f"loss_fn_config keys {sorted(unknown)} mean nothing to {loss_fn}")
    low, high = clip_thresholds(config)
    if not (0 <= low <= 1 <= high):
        raise LossInputError(f"need 0 ≤ clip_low_threshold ≤ 1 ≤ clip_high_threshold, got {low}, {high}")


def clip_thresholds(config: dict[str, float | str]) -> tuple[float, float]:
    return float(config.get("clip_low_threshold", CLIP_DEFAULTS[0])), float(config.get("clip_high_threshold",
                                                                                       CLIP_DEFAULTS[1]))


def loss_sum(loss_fn: str, config: dict[str, float | str], b: LossBatch) -> torch.Tensor:
    """The loss of the micro-batch (a sum, as Tinker defines it), differentiable in `b.target_logprobs`."""
    if loss_fn == "cross_entropy":
        return -(b.weights * b.target_logprobs * b.mask).sum()
    if loss_fn == "importance_sampling":
        cfg = LossConfig(policy_loss="ppo", eps_low=1.0, eps_high=math.inf, aggregation="token_mean")
    else:
        low, high = clip_thresholds(config)
        cfg = LossConfig(policy_loss=loss_fn, eps_low=1.0 - low, eps_high=high - 1.0, aggregation="token_mean")
    terms, _ = policy_loss(cfg, b.target_logprobs, b.sampling_logprobs, b.advantages, b.mask)
    return terms.total
