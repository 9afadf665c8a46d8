"""The trainer side of GEAR's learned mixing (`gear_mix`): a small head over the policy's hidden state that
mixes K advantage granularities per token, and an EMA teacher for self-distillation.

Per policy token: w = softmax(W·h) (h: the last hidden state, detached, so the head learns from the loss
but never moves the policy through h; W starts at zero, so w starts uniform), A = Σ_k w_k·A_k. The head
has its own AdamW (`mixer_lr`) and an entropy regulariser −λ·H(w) that keeps it from collapsing onto one
granularity. The teacher is an exponential moving average of the policy (θ_T ← d·θ_T + (1−d)·θ after every
optimizer step) and adds β·sigmoid(|A|)·KL(π_student ‖ π_teacher) per token."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.distributed as dist

from sleuth.training.engine import full_state_dict


@dataclass
class MixingConfig:
    granularities: int
    mixer_lr: float = 1e-3
    entropy_coef: float = 0.01
    ema_decay: float = 0.99
    distill_coef: float = 0.1


class Mixing:
    def __init__(self, cfg: MixingConfig, module: torch.nn.Module, hidden_size: int):
        self.cfg = cfg
        dev = next(module.parameters()).device
        self.head = torch.nn.Linear(hidden_size, cfg.granularities, bias=False).to(dev)
        torch.nn.init.zeros_(self.head.weight)
        self.opt = torch.optim.AdamW(self.head.parameters(), lr=cfg.mixer_lr)
        base = module.get_base_model() if hasattr(module, "get_base_model") else module
        self.teacher = copy.deepcopy(base).eval().requires_grad_(False)
        self.teacher.load_state_dict(full_state_dict(module), strict=False)

    def combine(self, hidden: torch.Tensor, adv_k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(mixed advantage (B, L), per-token −λ·H(w) (B, L), weights (B, L, K)) for hidden (B, L, H) and
        advantages (B, L, K). Position t's weights come from the hidden state that predicts token t."""
        logits = torch.zeros(adv_k.shape, device=adv_k.device)
        logits[:, 1:] = self.head(hidden[:, :-1].detach().float())
        w = torch.softmax(logits, -1)
        entropy = -(w * torch.log(w + 1e-12)).sum(-1)
        return (w * adv_k).sum(-1), -self.cfg.entropy_coef * entropy, w

    def distill(self, student_logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                mask: torch.Tensor, adv: torch.Tensor, temperature: float) -> torch.Tensor:
        """Per-token β·sigmoid(|A|)·KL(student ‖ teacher) on the masked positions (0 elsewhere)."""
        with torch.no_grad():
            t_logits = self.teacher(input_ids=input_ids, attention_mask=attention_mask).logits / temperature
        sel = mask[:, 1:].bool()
        s = torch.log_softmax(student_logits[:, :-1][sel].float(), -1)
        t = torch.log_softmax(t_logits[:, :-1][sel].float(), -1)
        kl = (s.exp() * (s - t)).sum(-1)
        out = torch.zeros(mask.shape, device=student_logits.device)
        out[:, 1:][sel] = self.cfg.distill_coef * torch.sigmoid(adv[:, 1:][sel].detach().abs()) * kl
        return out

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
        d = self.cfg.ema_decay
        with torch.no_grad():
            for name, p in self.teacher.named_parameters():  # tied weights appear once here
                if name in state:
                    p.mul_(d).add_(state[name].to(p.dtype), alpha=1 - d)
