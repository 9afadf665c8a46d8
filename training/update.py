"""One policy update: micro-batched forward/backward of the loss over the loss mask, one optimizer step.

The loss numerators of all micro-batches on all ranks are divided by one global denominator (tokens or
sequences of the whole update batch), and DeepSpeed averages gradients over ranks, so the gradient is the
same however the batch is split into micro-batches and processes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from sleuth.agents.trajectory import Trajectory
from sleuth.training.batch import Batch, micro_batches
from sleuth.training.engine import device
from sleuth.training.losses import LossConfig, aggregate, denominator, policy_loss, token_logprobs
from sleuth.training.mixing import Mixing


class PolicyUpdater:
    def __init__(self, engine: Any, loss: LossConfig, pad_id: int, micro_batch_tokens: int,
                 ref: torch.nn.Module | None = None, temperature: float = 1.0, mixing: Mixing | None = None):
        self.engine, self.loss, self.pad_id, self.micro_batch_tokens, self.ref = engine, loss, pad_id, micro_batch_tokens, ref
        # The policy being optimised is the sampling distribution softmax(logits / T), as in the rollouts.
        self.temperature = temperature if temperature > 0 else 1.0
        self.mixing = mixing  # GEAR's learned mixing of advantage granularities + EMA self-distillation

    def update(self, trajs: Sequence[Trajectory], advantages: Sequence[np.ndarray]) -> dict[str, Any]:
        """One optimizer step over this rank's trajectories (every rank runs the same number of micro-batches,
        padding with empty ones, because ZeRO's collectives need every rank in every forward/backward)."""
        lc = self.loss
        pairs = [(t, a) for t, a in zip(trajs, advantages, strict=True) if t.num_policy_tokens > 0]
        batches = micro_batches([p[0] for p in pairs], [p[1] for p in pairs], self.pad_id,
                                self.micro_batch_tokens)
        denom = all_sum(sum(denominator(b.loss_mask, lc.aggregation) for b in batches))
        n_micro = int(all_max(len(batches)))
        if denom == 0:
            return {"skipped": 1}
        dev = device()
        loss_sum = 0.0
        acc: dict[str, list] = {k: [] for k in ("ratio", "clip_low", "clip_high", "kl", "entropy", "mismatch",
                                                "mix_weights")}
        self.engine.train()
        for i in range(n_micro):
            b = (batches[i] if i < len(batches) else _empty_like(batches[0] if batches else None, self.pad_id)).to(dev)
            out = self.engine(input_ids=b.input_ids, attention_mask=b.attention_mask,
                              output_hidden_states=self.mixing is not None)
            logits = out.logits / self.temperature
            logp, ent = token_logprobs(logits, b.input_ids, b.loss_mask, with_entropy=True)
            ref = self._ref_logprobs(b) if self.ref is not None else None
            adv, extra = b.advantages, None
            if self.mixing is not None:
                k = self.mixing.cfg.granularities
                adv_k = adv if adv.dim() == 3 else adv.unsqueeze(-1).expand(*adv.shape, k)
                adv, extra, w = self.mixing.combine(out.hidden_states[-1], adv_k)
                extra = extra + self.mixing.distill(logits, b.input_ids, b.attention_mask, b.loss_mask, adv,
                                                    self.temperature)
                acc["mix_weights"].append(w.detach()[b.loss_mask.bool()].cpu())
            # One optimizer step per rollout batch: the trainer's recomputed old logprobs are this forward's.
            num, stats = policy_loss(lc, logp, logp.detach(), adv, b.loss_mask, ref, ent)
            if extra is not None:
                num = num + aggregate(extra, b.loss_mask, lc.aggregation, lc.norm_length)
            self.engine.backward(num * (dist.get_world_size() / denom), scale_wrt_gas=False)
            loss_sum += float(num.detach()) / denom
            m = b.loss_mask.bool()
            acc["mismatch"].append((logp.detach()[m] - b.sampling_logprobs[m]).abs().cpu())
            for k in ("ratio", "clip_low", "clip_high", "kl", "entropy"):
                if stats[k] is not None:
                    acc[k].append(stats[k].cpu())
        self.engine.step()
        if self.mixing is not None:
            self.mixing.after_step(self.engine.module)
        gn = self.engine.get_global_grad_norm()
        mix = acc.pop("mix_weights")
        out = {k: torch.cat(v).tolist() if v else [] for k, v in acc.items()}
        if mix:
            out["mix_weights"] = torch.cat(mix).mean(0).tolist()
        out.update(loss=loss_sum, grad_norm=float(gn) if gn is not None else float("nan"),
                   train_tokens=int(sum(b.attention_mask.sum() for b in batches)))
        return out

    @torch.no_grad()
    def _ref_logprobs(self, b: Batch) -> torch.Tensor:
        logits = self.ref(input_ids=b.input_ids, attention_mask=b.attention_mask).logits / self.temperature
        return token_logprobs(logits, b.input_ids, b.loss_mask)[0]


def _empty_like(b: Batch | None, pad_id: int) -> Batch:
    """A micro-batch with no policy tokens: it keeps a rank in step with the others' collectives."""
    if b is None:
        ids = torch.full((1, 2), pad_id, dtype=torch.long)
        z = torch.zeros((1, 2))
        return Batch(ids, torch.ones_like(ids), z, z.clone(), z.clone(), [])
    return Batch(b.input_ids[:1], b.attention_mask[:1], torch.zeros_like(b.loss_mask[:1]),
                 torch.zeros_like(b.advantages[:1]), b.sampling_logprobs[:1], [])


def all_sum(x: float) -> float:
    t = torch.tensor([float(x)], dtype=torch.float64, device=device())  # NCCL reduces CUDA tensors only
    dist.all_reduce(t)
    return float(t)


def all_max(x: float) -> float:
    t = torch.tensor([float(x)], dtype=torch.float64, device=device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


