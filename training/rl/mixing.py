"""The trainer side of GEAR's learned mixing (`gear_mix`): a small head over the policy's hidden state that
mixes K advantage granularities per token, and an EMA teacher for self-distillation.

Per policy token: w = softmax(W·h) (h: the last hidden state, detached; W starts at zero, so w starts
uniform) and A = Σ_k w_k·A_k. The policy loss sees A with the stop-gradient: were A differentiable there,
the head would be pushed towards argmax_k A_k and the mixed advantage would drift upward whatever the
granularities say. The head learns only from its own objective, which is the self-distillation term read
as a function of w:

    policy:  β·sigmoid(|sg A|)·KL(π_student ‖ π_teacher)        (moves the policy, not the head)
    head:    β·sigmoid(|A|)·sg(KL) − λ·H(w)                       (moves the head, not the policy)

so the head learns to put less credit where the policy has moved furthest from its slow EMA teacher (a
trust-region-like damping of the update where it is least stable), and the entropy regulariser keeps it
from collapsing onto one granularity. Both depend on A only through |A|: they have no preferred sign, and
with zero-mean granularities the mixed advantage stays zero-mean. The head has its own AdamW
(`mixer_lr`). The teacher is an exponential moving average of the policy (θ_T ← d·θ_T + (1−d)·θ after
every optimizer step): a plain model of the base architecture (no LoRA layers) whose parameters carry the
names of `full_state_dict`'s keys, so θ for a LoRA policy is its merged weights W + ΔW."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from sleuth.rewards.base import MixingSpec
from sleuth.training.rl.forward import Scored, ScoredForward
from sleuth.training.zero import full_state_dict


@dataclass
class MixTerms:
    advantage: torch.Tensor  # (B, L) the mixed advantage, detached: what the policy loss uses
    per_token: torch.Tensor  # (B, L) the policy's distillation term plus the head's objective
    weights: torch.Tensor  # (B, L, K) the mixing weights


class Mixing:
    def __init__(self, cfg: MixingSpec, module: torch.nn.Module, hidden_size: int, temperature: float = 1.0,
                 packing: bool = True):
        self.cfg = cfg
        dev = next(module.parameters()).device
        self.head = torch.nn.Linear(hidden_size, cfg.granularities, bias=False).to(dev)
        torch.nn.init.zeros_(self.head.weight)
        self.opt = torch.optim.AdamW(self.head.parameters(), lr=cfg.mixer_lr)
        state = full_state_dict(module)
        self.teacher = plain_copy(module, state).eval().requires_grad_(False)
        self.teacher.load_state_dict(state, strict=True)  # a name the state lacks raises
        self.teacher_forward = ScoredForward(self.teacher, self.teacher, temperature, packed=packing)

    def weights(self, hidden: torch.Tensor, k: int) -> torch.Tensor:
        """(B, L, K) weights for hidden (B, L, H): position t's come from the hidden state that predicts token t."""
        logits = torch.zeros((*hidden.shape[:2], k), device=hidden.device)
        logits[:, 1:] = self.head(hidden[:, :-1].detach().float())
        return torch.softmax(logits, -1)

    def distill_kl(self, student: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   mask: torch.Tensor) -> torch.Tensor:
        """Per-token KL(student ‖ teacher) on the masked positions (0 elsewhere), differentiable in the student
        (`student`: the (n, V) scored logits, already divided by the temperature)."""
        with torch.no_grad():
            teacher = self.teacher_forward(input_ids, attention_mask, mask).logits
        sel = mask[:, 1:].bool()
        s = torch.log_softmax(student.float(), -1)
        t = torch.log_softmax(teacher.float(), -1)
        out = torch.zeros(mask.shape, device=student.device)
        out[:, 1:][sel] = (s.exp() * (s - t)).sum(-1)
        return out

    def terms(self, student: Scored, adv_k: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor,
              mask: torch.Tensor) -> MixTerms:
        """The mixed advantage (for the policy loss) and the per-token terms this component adds to the loss."""
        w = self.weights(student.hidden, adv_k.shape[-1])
        mixed = (w * adv_k).sum(-1)
        kl = self.distill_kl(student.logits, input_ids, attention_mask, mask)
        beta = self.cfg.distill_coef
        policy = beta * torch.sigmoid(mixed.detach().abs()) * kl
        entropy = -(w * torch.log(w + 1e-12)).sum(-1)
        head = beta * torch.sigmoid(mixed.abs()) * kl.detach() - self.cfg.entropy_coef * entropy
        return MixTerms(mixed.detach(), policy + head, w)

    def after_step(self, module: torch.nn.Module) -> None:
        """Step the head (gradients averaged over ranks) and move the teacher towards the policy."""
        if dist.is_initialized() and dist.get_world_size() > 1:
            for p in self.head.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= dist.get_world_size()
        self.opt.step()
        self.opt.zero_grad()
        state = full_state_dict(module)
        params = dict(self.teacher.named_parameters())  # tied weights appear once here
        missing = sorted(set(params) - set(state))
        if missing:  # the EMA would silently leave these at their start
            raise KeyError(f"the policy's weights lack {len(missing)} of the EMA teacher's parameters, e.g. "
                           f"{missing[:3]}")
        d = self.cfg.ema_decay
        with torch.no_grad():
            for name, p in params.items():
                p.mul_(d).add_(state[name].to(p.dtype), alpha=1 - d)


def plain_copy(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A fresh model of the policy's base architecture, without LoRA layers (parameter names as
    `full_state_dict`'s keys), to be loaded with the policy's merged weights. Built from the config rather
    than copied: under ZeRO-3 the policy's own parameters are partitions, and a copy would hold none. `state`
    (`full_state_dict` of the policy) sets its dtype and device."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = module.get_base_model() if isinstance(module, PeftModel) else module
    first = next(iter(state.values()))
    return AutoModelForCausalLM.from_config(base.config).to(device=first.device, dtype=first.dtype)
