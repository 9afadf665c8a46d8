"""One policy update: PPO's inner loop over the rollout batch, with the ratio taken against π_old.

The step's trajectories are split into `mini_batches` parts (a seeded permutation per epoch), one optimizer
step each, repeated for `epochs`: from the second optimizer step on π_θ ≠ π_old and the clip acts. π_old is
the pre-update trainer policy (`old_logprobs="recompute"`: a no-grad forward once per rollout batch; with a
single optimizer step and no mismatch correction it is the update forward's own logprobs, the same values
without the extra forward) or the rollout engine's sampling logprobs (`"rollout"`).

Within an optimizer step, the loss numerators of all micro-batches on all ranks are divided by one global
denominator (tokens or sequences of the mini-batch on every rank), and DeepSpeed averages gradients over
ranks, so the gradient is the same however the mini-batch is split into micro-batches and processes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from sleuth.agents.trajectory import Trajectory
from sleuth.training.distill.signal import DistillConfig, TeacherTokens, reverse_kl_penalty, topk_divergence
from sleuth.training.rl.batch import Batch, micro_batches
from sleuth.training.rl.forward import ScoredForward
from sleuth.training.rl.losses import (
    LossConfig,
    aggregate,
    denominator,
    importance_weights,
    policy_loss,
)
from sleuth.training.rl.mixing import Mixing
from sleuth.training.zero import device

OLD_LOGPROBS = ("recompute", "rollout")


@dataclass
class UpdateConfig:
    """`update:`: how the policy update batches its tokens and loops over the step's trajectories."""

    micro_batch_tokens: int = 4096  # tokens per forward/backward: padded ones, or real ones when packed
    # Packed micro-batches: the forward runs each micro-batch's sequences as one row without padding
    # (attention confined to each sequence), the losses see the padded path's numbers (bench/update_memory.py
    # measures time and peak memory against the padded path).
    packing: bool = True
    # Packed rows lay a common prefix of their sequences out once (a group's prompt): exact, the prompt's
    # forward and backward paid once per micro-batch instead of once per member. Needs `packing` on a model
    # that runs SDPA (sleuth's segment attention); elsewhere packed rows hold whole sequences.
    share_prefix: bool = True
    # The LM head and log-softmax run this many scored positions at a time, each chunk recomputed in the
    # backward pass when there are several: the (n, V) fp32 logits of a long completion are never all kept.
    logit_chunk: int = 1024
    # PPO's inner loop (verl's ppo_epochs / ppo_mini_batch_size): the step's trajectories are split into
    # `mini_batches` parts, one optimizer step each, and the pass is repeated `epochs` times.
    epochs: int = 1
    mini_batches: int = 1
    # π_old of the ratio: recompute (a no-grad forward of the pre-update policy, once per rollout batch) or
    # rollout (the engine's sampling logprobs: the ratio then also carries the engine–trainer mismatch)
    old_logprobs: str = "recompute"
    sync_tolerance: float = 1e-3  # max |Δ logit| between trainer and the transformers engine after a sync
    sync_tolerance_vllm: float = 0.02  # max |Δ logprob| (top-5 of a probe) for vLLM: other kernels, same weights
    # How the weights reach Ray rollout workers: object_store (one copy in Ray's object store, shared memory on
    # one node) or collective (a gloo / NCCL group with the workers, broadcast in buckets: no second copy, no
    # shared store; for workers on other nodes). docs/scale.md.
    sync_transport: str = "object_store"
    sync_bucket_mb: float = 256.0  # collective: bytes per broadcast (each side holds one bucket extra)

    def __post_init__(self) -> None:
        if self.sync_transport not in ("object_store", "collective"):
            raise ValueError(f"update.sync_transport must be object_store or collective; got {self.sync_transport!r}")
        if not self.sync_bucket_mb > 0:
            raise ValueError(f"update.sync_bucket_mb must be > 0, got {self.sync_bucket_mb}")
        if self.old_logprobs not in OLD_LOGPROBS:
            raise ValueError(f"update.old_logprobs must be one of {', '.join(OLD_LOGPROBS)}; got {self.old_logprobs!r}")
        if self.epochs < 1 or self.mini_batches < 1:
            raise ValueError(f"update.epochs and update.mini_batches must be ≥ 1, "
                             f"got {self.epochs}, {self.mini_batches}")
        if self.micro_batch_tokens < 1:
            raise ValueError(f"update.micro_batch_tokens must be ≥ 1, got {self.micro_batch_tokens}")
        if self.logit_chunk < 1:
            raise ValueError(f"update.logit_chunk must be ≥ 1, got {self.logit_chunk}")


TOKEN_STATS = ("ratio", "log_ratio", "log_ratio_clamped", "clip_low", "clip_high", "clip_dual", "kl", "entropy",
               "mismatch", "is_weight", "is_clipped", "is_masked", "mixed_adv", "distill_kl", "distill_turn",
               "distill_signal")


@dataclass
class UpdateStats:
    """What one update measured on this rank. Per-token lists hold one value per policy token the update saw
    (`mismatch`, `is_*`, `mixed_adv`: first epoch only); the losses are this rank's numerators over the global
    denominator, averaged over optimizer steps, so they sum over ranks."""

    ratio: list[float] = field(default_factory=list)
    log_ratio: list[float] = field(default_factory=list)  # log π_θ − log π_old
    log_ratio_clamped: list[float] = field(default_factory=list)  # 1 where |log ratio| passed LOG_RATIO_CLAMP
    clip_low: list[float] = field(default_factory=list)
    clip_high: list[float] = field(default_factory=list)
    clip_dual: list[float] = field(default_factory=list)
    kl: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    mismatch: list[float] = field(default_factory=list)  # |log π_old − log π_rollout| (the pre-update policy)
    is_weight: list[float] = field(default_factory=list)
    is_clipped: list[float] = field(default_factory=list)
    is_masked: list[float] = field(default_factory=list)
    mixed_adv: list[float] = field(default_factory=list)  # gear_mix: the advantage the loss used
    mix_weights: list[float] = field(default_factory=list)  # gear_mix: mean weight per granularity
    # distillation (first epoch): per policy token with a teacher signal, log π_s − log π_T and its turn; per
    # policy token, 1 where the teacher scored it
    distill_kl: list[float] = field(default_factory=list)
    distill_turn: list[float] = field(default_factory=list)
    distill_signal: list[float] = field(default_factory=list)
    loss_policy: float = 0.0
    loss_kl: float = 0.0
    loss_entropy: float = 0.0
    loss_mix: float = 0.0
    loss_distill: float = 0.0  # the top-k kinds' loss term (reverse_kl enters the advantage instead)
    group_ess: list[float] = field(default_factory=list)  # per group, see `group_ess`
    grad_norm: float = float("nan")
    optimizer_steps: int = 0
    train_tokens: int = 0


@dataclass
class _Tally:
    """What an update measures across its optimizer steps."""
    stats: dict[str, list[torch.Tensor]] = field(default_factory=lambda: {k: [] for k in (*TOKEN_STATS, "mix")})
    losses: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(("policy", "kl", "entropy", "mix", "distill"), 0.0))
    grad_norms: list[float] = field(default_factory=list)
    # per group: each member's sequence log-weight log π_old(y) − log π_rollout(y), measured once
    seq_log_w: dict[str, list[float]] = field(default_factory=dict)

    def add(self, key: str, value: torch.Tensor) -> None:
        self.stats[key].append(value.detach().cpu())

    def result(self, train_tokens: int) -> UpdateStats:
        steps = len(self.grad_norms)
        if steps == 0:
            return UpdateStats()
        mix = self.stats["mix"]
        return UpdateStats(**{k: torch.cat(self.stats[k]).tolist() if self.stats[k] else [] for k in TOKEN_STATS},
                           mix_weights=torch.cat(mix).mean(0).tolist() if mix else [],
                           **{f"loss_{k}": v / steps for k, v in self.losses.items()},
                           group_ess=[group_ess(v) for v in self.seq_log_w.values()],
                           grad_norm=float(np.mean(self.grad_norms)), optimizer_steps=steps, train_tokens=train_tokens)


def group_ess(log_w: Sequence[float]) -> float:
    """Normalised effective sample size of a group, (Σw)² / (n·Σw²) with w its members' sequence importance
    weights π_old/π_rollout: 1 when every member counts alike (on policy, no engine mismatch), 1/n when one
    member carries the group (stale or mismatched samples)."""
    lw = np.asarray(log_w, dtype=np.float64)
    w = np.exp(lw - lw.max())
    return float(w.sum() ** 2 / (len(w) * (w**2).sum()))


class PolicyUpdater:
    """The policy update of `update:` (its batching and PPO loop) under the objective of `loss:`. `ref` is the
    frozen reference model of the KL term, `mixing` GEAR's learned mix of advantage granularities, `distill`
    how a teacher's numbers (given to `update`) enter; `seed` orders the mini-batches."""

    def __init__(self, engine: Any, update: UpdateConfig, loss: LossConfig, pad_id: int,
                 ref: torch.nn.Module | None = None, temperature: float = 1.0, mixing: Mixing | None = None,
                 seed: int = 0, distill: DistillConfig | None = None):
        if loss.rollout_is != "none" and update.old_logprobs == "rollout":
            raise ValueError("rollout_is needs old_logprobs='recompute' (with 'rollout' π_old is π_rollout)")
        self.engine, self.cfg, self.loss, self.pad_id, self.ref = engine, update, loss, pad_id, ref
        # The policy being optimised is the sampling distribution softmax(logits / T), as in the rollouts.
        self.temperature = temperature if temperature > 0 else 1.0
        self.policy = ScoredForward(engine, engine.module, self.temperature, packed=update.packing,
                                    chunk=update.logit_chunk, share_prefix=update.share_prefix)
        self.ref_forward = (ScoredForward(ref, ref, self.temperature, packed=update.packing, chunk=update.logit_chunk,
                                          share_prefix=update.share_prefix) if ref is not None else None)
        self.mixing = mixing  # GEAR's learned mixing of advantage granularities + EMA self-distillation
        self.seed, self.calls = seed, 0
        self.distill = distill if distill is not None and distill.enabled else None

    def update(self, trajs: Sequence[Trajectory], advantages: Sequence[np.ndarray],
               teacher: Sequence[TeacherTokens] | None = None) -> UpdateStats:
        """`epochs × mini_batches` optimizer steps over this rank's trajectories (`teacher`: the distillation
        teacher's numbers for each). Every rank runs the same number of forwards in every step (padding with
        empty micro-batches), because ZeRO's collectives need every rank in every forward/backward."""
        self.calls += 1
        if (self.distill is not None) != (teacher is not None):
            raise ValueError("a distillation update needs the teacher's numbers, and only it takes them")
        keep = [i for i, t in enumerate(trajs) if t.num_policy_tokens > 0]
        trajs, advantages = [trajs[i] for i in keep], [advantages[i] for i in keep]
        teacher = [teacher[i] for i in keep] if teacher is not None else None
        one_step = self.cfg.epochs * self.cfg.mini_batches == 1
        recompute = self.cfg.old_logprobs == "recompute" and not (one_step and self.loss.rollout_is == "none")
        old = self._recompute(trajs) if recompute else None
        tally = _Tally()
        rng = np.random.default_rng(self.seed * 1_000_003 + self.calls)
        for epoch in range(self.cfg.epochs):
            order = rng.permutation(len(trajs))
            for part, idx in enumerate(np.array_split(order, self.cfg.mini_batches)):
                # Every token is measured once, in the first epoch; without a recompute only the first
                # step's forward runs the pre-update policy, so it alone measures the engine–trainer mismatch.
                first_pass = epoch == 0
                self._optimizer_step([trajs[i] for i in idx], [advantages[i] for i in idx],
                                     [old[i] for i in idx] if old is not None else None, tally, first_pass,
                                     first_pass and (old is not None or part == 0),
                                     [teacher[i] for i in idx] if teacher is not None else None)
        return tally.result(sum(len(t.token_ids()) for t in trajs) * self.cfg.epochs)

    # -- π_old --------------------------------------------------------------------------------------
    @torch.no_grad()
    def _recompute(self, trajs: Sequence[Trajectory]) -> list[torch.Tensor]:
        """The pre-update policy's logprobs of every trajectory (aligned with its token ids, 0 off the mask)."""
        zeros = [np.zeros(t.num_policy_tokens) for t in trajs]
        batches = micro_batches(trajs, zeros, self.pad_id, self.cfg.micro_batch_tokens,
                                packed=self.policy.uses_packing(), share=self.policy.shares_prefix())
        out: list[torch.Tensor | None] = [None] * len(trajs)
        dev = device()
        for i in range(int(all_max(len(batches)))):
            b = (batches[i] if i < len(batches) else empty_batch(batches[0] if batches else None, self.pad_id)).to(dev)
            scored = self.policy(b.input_ids, b.attention_mask, b.loss_mask)
            lp = scored.logprobs(b.input_ids, b.loss_mask)[0].cpu()
            for row, j in enumerate(b.index):
                out[j] = lp[row, :len(trajs[j].token_ids())]
        return out  # type: ignore[return-value]

    # -- one optimizer step -------------------------------------------------------------------------
    def _optimizer_step(self, trajs: list[Trajectory], advantages: list[np.ndarray], old: list[torch.Tensor] | None,
                        tally: _Tally, first_pass: bool, measure_mismatch: bool,
                        teacher: list[TeacherTokens] | None = None) -> None:
        """Forward/backward of every micro-batch of this mini-batch, then one optimizer step (none where no
        rank has a policy token)."""
        lc = self.loss
        batches = (micro_batches(trajs, advantages, self.pad_id, self.cfg.micro_batch_tokens, old,
                                 packed=self.policy.uses_packing(), share=self.policy.shares_prefix(),
                                 teacher=teacher) if trajs else [])
        weights = []
        for k, b in enumerate(batches):
            iw = None
            if lc.rollout_is != "none":
                iw = importance_weights(b.old_logprobs, b.sampling_logprobs, b.loss_mask, lc.rollout_is,
                                        lc.rollout_is_level, lc.rollout_is_cap)
                if first_pass:
                    m = b.loss_mask.bool()
                    tally.add("is_weight", iw.weight[m])
                    if lc.rollout_is == "tis":
                        tally.add("is_clipped", (iw.ratio > lc.rollout_is_cap).float())
                    else:
                        tally.add("is_masked", 1.0 - iw.keep[m])
                batches[k] = b.with_loss_mask(b.loss_mask * iw.keep)  # masked IS: out of loss and denominator
            weights.append(iw)
        denom = all_sum(sum(denominator(b.loss_mask, lc.aggregation) for b in batches))
        n_micro = int(all_max(len(batches)))
        if denom == 0:
            return
        dev = device()
        scale = dist.get_world_size() / denom
        self.engine.train()
        for i in range(n_micro):
            real = i < len(batches)
            b = (batches[i] if real else empty_batch(batches[0] if batches else None, self.pad_id)).to(dev)
            iw = weights[i] if real else None
            scored = self.policy(b.input_ids, b.attention_mask, b.loss_mask)
            logp, ent = scored.logprobs(b.input_ids, b.loss_mask, with_entropy=True)
            ref = self._ref_logprobs(b) if self.ref_forward is not None else None
            old_logp = b.old_logprobs if old is not None or self.cfg.old_logprobs == "rollout" else logp.detach()
            adv, extra = b.advantages, None
            if self.mixing is not None:
                k = self.mixing.cfg.granularities
                adv_k = adv if adv.dim() == 3 else adv.unsqueeze(-1).expand(*adv.shape, k)
                mix = self.mixing.terms(scored, adv_k, b.input_ids, b.attention_mask, b.loss_mask)
                adv, extra = mix.advantage, mix.per_token
                if first_pass:
                    m = b.loss_mask.bool()
                    tally.add("mix", mix.weights[m])
                    tally.add("mixed_adv", adv[m])
            distill_num = None
            if self.distill is not None and b.teacher is not None:
                adv, distill_num = self._distill(scored, logp, adv, b, tally, first_pass)
            terms, stats = policy_loss(lc, logp, old_logp, adv, b.loss_mask, ref, ent,
                                       iw.weight.to(dev) if iw is not None else None)
            total = terms.total
            if extra is not None:
                mix_num = aggregate(extra, b.loss_mask, lc.aggregation, lc.norm_length)
                total = total + mix_num
                tally.losses["mix"] += float(mix_num.detach()) / denom
            if distill_num is not None:
                total = total + distill_num
                tally.losses["distill"] += float(distill_num.detach()) / denom
            self.engine.backward(total * scale, scale_wrt_gas=False)
            for key, value in (("policy", terms.policy), ("kl", terms.kl), ("entropy", terms.entropy)):
                tally.losses[key] += float(value.detach()) / denom
            m = b.loss_mask.bool()
            if measure_mismatch and real:
                pre = b.old_logprobs if old is not None else logp.detach()
                tally.add("mismatch", (pre[m] - b.sampling_logprobs[m]).abs())
                seq_lw = ((pre - b.sampling_logprobs) * b.loss_mask).sum(-1).tolist()
                for row, j in enumerate(b.index):
                    tally.seq_log_w.setdefault(trajs[j].group or trajs[j].task_id, []).append(seq_lw[row])
            tally.add("log_ratio", torch.log(stats["ratio"].clamp(min=1e-30)))
            for key in ("ratio", "log_ratio_clamped", "clip_low", "clip_high", "clip_dual", "kl", "entropy"):
                if stats[key] is not None:
                    tally.add(key, stats[key])
        self.engine.step()
        if self.mixing is not None:
            self.mixing.after_step(self.engine.module)
        gn = self.engine.get_global_grad_norm()
        tally.grad_norms.append(float(gn) if gn is not None else float("nan"))

    def _distill(self, scored: Any, logp: torch.Tensor, adv: torch.Tensor, b: Batch, tally: _Tally,
                 first_pass: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The teacher's signal on this micro-batch: `reverse_kl` as a per-token penalty on the advantage (the
        returned advantage), the top-k kinds as a loss numerator (returned beside it)."""
        cfg, lc, t = self.distill, self.loss, b.teacher
        mask = b.loss_mask * t.signal  # policy tokens the teacher scored
        student = logp.detach() if cfg.at == "current" else b.sampling_logprobs
        if first_pass:
            m, policy = mask.bool(), b.loss_mask.bool()
            tally.add("distill_kl", (student - t.logprobs)[m])
            tally.add("distill_turn", t.turn[m].float())
            tally.add("distill_signal", t.signal[policy])
        if cfg.kind == "reverse_kl":
            return adv - cfg.coef * reverse_kl_penalty(student, t.logprobs, mask, cfg.discount), None
        sel = b.loss_mask[:, 1:].bool()  # the scored positions, in the order of `scored`'s rows
        div = topk_divergence(scored.logprobs_at(t.topk_ids[:, 1:][sel]), t.topk_logprobs[:, 1:][sel], cfg.kind,
                              cfg.beta)
        per_tok = torch.zeros_like(logp)
        per_tok[:, 1:][sel] = div
        return adv, cfg.coef * aggregate(per_tok * t.signal, b.loss_mask, lc.aggregation, lc.norm_length)

    @torch.no_grad()
    def _ref_logprobs(self, b: Batch) -> torch.Tensor:
        scored = self.ref_forward(b.input_ids, b.attention_mask, b.loss_mask)
        return scored.logprobs(b.input_ids, b.loss_mask)[0]


def empty_batch(b: Batch | None, pad_id: int) -> Batch:
    """A micro-batch with no policy tokens: it keeps a rank in step with the others' collectives."""
    if b is None:
        ids = torch.full((1, 2), pad_id, dtype=torch.long)
        z = torch.zeros((1, 2))
        return Batch(ids, torch.ones_like(ids), z, z.clone(), z.clone(), [])
    return Batch(b.input_ids[:1], b.attention_mask[:1], torch.zeros_like(b.loss_mask[:1]),
                 torch.zeros_like(b.advantages[:1]), b.sampling_logprobs[:1], [], b.old_logprobs[:1])


def all_sum(x: float) -> float:
    t = torch.tensor([float(x)], dtype=torch.float64, device=device())  # NCCL reduces CUDA tensors only
    dist.all_reduce(t)
    return float(t)


def all_max(x: float) -> float:
    t = torch.tensor([float(x)], dtype=torch.float64, device=device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)
