"""GEAR, ground-truth-conditioned form (`gear_gt`): token weights that reshape the GRPO advantage.

Li et al. 2026, *GEAR: Granularity-Adaptive Advantage Reweighting for LLM Agents via Self-Distillation*
(arXiv:2605.11853). The student is the on-policy model on the trajectory as it is; the teacher is the same
model with the ground truth in context (here: the gold answer and supporting titles in an extra system
message before the trajectory). Both are the reader model, which holds the policy's merged weights: the
trainer loads them at setup and after every `refresh_every` optimizer steps (default 1, every step).

Per policy token t: D_t = KL(p_teacher ‖ p_student) (clamped at 0: float rounding makes it slightly negative
where the two agree). A spike, D_s > μ + κ·σ over the trajectory's policy tokens, is a departure point: it
starts a segment that extends over the following tokens while the student's entropy stays ≥ τ (the
trajectory's median entropy by default) and ends at a low-entropy token, the next spike, or the end of the
turn. With d = D / mean(D) over the trajectory's policy tokens,

    w_t = 1 + α·d_s   for t in the segment that started at s (s itself included)
    w_t = 1 + α·d_t   outside segments (token-level resolution)

rescaled so that their mean over the trajectory's policy tokens is 1 (all 1 when mean(D) = 0), and
A_{i,t} = A^{grpo}_i · w_{i,t}. Trajectories whose GRPO advantage is 0 are not scored.

From the paper: the on-policy student, the ground-truth-conditioned teacher, divergence spikes as segment
anchors, token entropy as the signal that extends a segment, token-level weights where the student stays
aligned and the departure point's divergence modulating its segment. sleuth's choices, which the abstract
does not fix: the hint's text, the spike rule μ + κ·σ, the entropy threshold τ, the map w = 1 + α·d with the
scale-free d = D / mean(D), the mean-1 rescaling and GRPO as the outcome advantage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from sleuth.agents.trajectory import Trajectory
from sleuth.rewards.base import (
    Advantages,
    Estimator,
    MixingSpec,
    groups,
    per_token,
    per_turn,
    register,
)
from sleuth.rewards.group import GroupOutcome
from sleuth.rewards.info_gain import InfoGain
from sleuth.tasks.qa import qa_docs

HINT = "For grading only: the correct answer is {answer}. Supporting documents: {titles}."


def segment_starts(divergence: np.ndarray, entropy: np.ndarray, turn_ends: Sequence[int], kappa: float = 1.0,
                   tau: float | None = None) -> np.ndarray:
    """For each policy token, the index of the departure point whose segment holds it, or −1 outside segments
    (see the module docstring); `turn_ends` are the indices one past each turn's last token."""
    n = len(divergence)
    starts = np.full(n, -1)
    if n == 0:
        return starts
    spikes = divergence > divergence.mean() + kappa * divergence.std()
    tau = float(np.median(entropy)) if tau is None else tau
    ends = set(turn_ends)
    start = -1
    for t in range(n):
        if t in ends:
            start = -1
        if spikes[t]:
            start = t
        elif start >= 0 and entropy[t] < tau:
            start = -1
        starts[t] = start
    return starts


def segment_weights(divergence: np.ndarray, entropy: np.ndarray, turn_ends: Sequence[int], kappa: float = 1.0,
                    tau: float | None = None, alpha: float = 1.0) -> np.ndarray:
    """Weights for one trajectory's policy tokens, mean 1 (see the module docstring). `divergence` must be
    ≥ 0: a negative d would give a weight below 1, and below 0 one that flips the advantage's sign."""
    if np.any(divergence < 0):
        raise ValueError("gear_gt divergences must be ≥ 0 (a KL)")
    n = len(divergence)
    if n == 0:
        return np.zeros(0)
    mean = float(divergence.mean())
    if mean == 0:
        return np.ones(n)
    starts = segment_starts(divergence, entropy, turn_ends, kappa, tau)
    anchor = np.where(starts >= 0, starts, np.arange(n))
    w = 1.0 + alpha * divergence[anchor] / mean
    return w / w.mean()


class GearGT(Estimator):
    def __init__(self, reader: Any = "smollm2", kappa: float = 1.0, tau: float | None = None, alpha: float = 1.0,
                 eps: float = 1e-6, refresh_every: int = 1):
        if refresh_every < 1:
            raise ValueError(f"gear_gt refresh_every must be ≥ 1 (its student and teacher are the current policy, "
                             f"loaded into the reader every refresh_every steps); got {refresh_every}")
        if isinstance(reader, str):
            from sleuth.rewards.reader import Reader

            reader = Reader(reader)
        self.reader, self.kappa, self.tau, self.alpha = reader, kappa, tau, alpha
        self.refresh_every = refresh_every
        self.outcome = GroupOutcome("grpo", eps)

    def refresh_due(self, step: int) -> bool:
        return step % self.refresh_every == 0

    def refresh(self, state: Mapping[str, Any]) -> None:
        """Load the policy's merged weights into the reader; a parameter name either side lacks raises (the
        reader would otherwise keep some of its own weights and stop being the policy)."""
        model = self.reader.model
        own, given = set(model.state_dict()), set(state)
        if own != given:
            raise ValueError(f"gear_gt loads the policy's weights into the reader, but their parameter names differ "
                             f"(reader only: {sorted(own - given)[:3]}, policy only: {sorted(given - own)[:3]}): "
                             f"name the policy's model as the reader")
        model.load_state_dict(dict(state), strict=True)
        self.reader.clear_cache()

    def check_policy(self, tokenizer: Any) -> None:
        """The reader scores the policy's own token ids: it must share the policy's vocabulary."""
        if self.reader.tokenizer.get_vocab() != tokenizer.get_vocab():
            raise ValueError("gear_gt reads the policy's token ids with the reader model, but their tokenizers differ: "
                             "name the policy's model (or one with the same tokenizer) as the reader")

    def hint_ids(self, task: Any) -> list[int]:
        tok = self.reader.tokenizer
        titles = "; ".join(qa_docs(task, missing_ok=True).supporting) or "none"
        text = HINT.format(answer=task.answer, titles=titles)
        rendered = tok.apply_chat_template([{"role": "system", "content": text}], tokenize=False)
        return tok(rendered, add_special_tokens=False)["input_ids"]

    @torch.no_grad()
    def token_signals(self, traj: Trajectory, task: Any) -> tuple[np.ndarray, np.ndarray]:
        """(KL(teacher ‖ student) clamped at 0, student entropy) at each policy token of the trajectory."""
        model = self.reader.model
        dev = next(model.parameters()).device
        ids = traj.token_ids()
        mask = np.array(traj.loss_mask(), dtype=bool)
        pos = np.nonzero(mask)[0]  # positions of policy tokens; predicted from pos − 1
        hint = self.hint_ids(task)

        def logprobs(seq: list[int], offset: int) -> torch.Tensor:
            logits = model(input_ids=torch.tensor([seq], device=dev)).logits[0].float()
            return torch.log_softmax(logits[torch.as_tensor(pos + offset - 1, device=dev)], -1)

        student = logprobs(ids, 0)
        teacher = logprobs(hint + ids, len(hint))
        kl = (teacher.exp() * (teacher - student)).sum(-1).clamp_min(0)
        ent = -(student.exp() * student).sum(-1)
        return kl.cpu().numpy(), ent.cpu().numpy()

    def __call__(self, trajs: Sequence[Trajectory], tasks: Mapping[str, Any]) -> Advantages:
        adv = self.outcome.trajectory_advantages(trajs)
        out, in_segment = [], []
        for traj, a in zip(trajs, adv, strict=True):
            if a == 0 or traj.num_policy_tokens == 0:
                out.append(per_token(traj, a))
                continue
            div, ent = self.token_signals(traj, tasks[traj.task_id])
            ends = np.cumsum([len(t.action_ids) for t in traj.turns])[:-1].tolist()
            in_segment.append(float(np.mean(segment_starts(div, ent, ends, self.kappa, self.tau) >= 0)))
            out.append(a * segment_weights(div, ent, ends, self.kappa, self.tau, self.alpha))
        return Advantages(out, {"gear_gt/segment_fraction": in_segment})


GRANULARITIES = ("outcome", "tool", "info_gain")


class GearMix(Estimator):
    """sleuth's learned-mixing variant of GEAR (`gear_mix`): K advantage granularities per token, each
    group-normalised, mixed in the trainer by a head over the policy's hidden state (`training.rl.mixing`: the
    head learns from its own objective, never from the policy loss), plus EMA self-distillation.
    Granularities: `outcome` (GRPO of the outcome reward), `tool` (+1 for a turn whose tool call ran, −1 for a
    malformed or failed one, z-scored over the group's turns), `info_gain` (CIGPO's discounted, normalised
    read gains; `step_reward` configures it, `refresh_every` included). Output: (tokens, K) per trajectory."""

    def __init__(self, granularities: Sequence[str] = ("outcome", "tool"), step_reward: Mapping[str, Any] | None = None,
                 mixer_lr: float = 1e-3, entropy_coef: float = 0.01, ema_decay: float = 0.99,
                 distill_coef: float = 0.1, eps: float = 1e-6):
        bad = [g for g in granularities if g not in GRANULARITIES]
        if bad or not granularities:
            raise ValueError(f"gear_mix granularities must be among {', '.join(GRANULARITIES)}; "
                             f"got {list(granularities)}")
        self.granularities, self.eps = list(granularities), eps
        self.outcome = GroupOutcome("grpo", eps)
        if "info_gain" in self.granularities:
            self.step_source = InfoGain(**{**dict(step_reward or {}), "outcome_weight": 0.0, "step_weight": 1.0})
        elif step_reward:
            raise ValueError("gear_mix step_reward configures the info_gain granularity, which is not in granularities")
        self.mixing = MixingSpec(len(self.granularities), mixer_lr, entropy_coef, ema_decay, distill_coef)

    def tool_advantages(self, trajs: Sequence[Trajectory]) -> list[np.ndarray]:
        out = [np.zeros(len(t.turns)) for t in trajs]
        for idx in groups(trajs).values():
            pool = [(i, k, -1.0 if turn.error else 1.0) for i in idx for k, turn in enumerate(trajs[i].turns)]
            v = np.array([x for *_, x in pool])
            if v.size < 2 or v.std() == 0:
                continue
            for (i, k, x) in pool:
                out[i][k] = (x - v.mean()) / (v.std() + self.eps)
        return [per_turn(t, a.tolist()) for t, a in zip(trajs, out, strict=True)]

    def __call__(self, trajs: Sequence[Trajectory], tasks: Mapping[str, Any]) -> Advantages:
        parts, metrics = [], {}
        for g in self.granularities:
            if g == "outcome":
                parts.append(self.outcome(trajs, tasks).values)
            elif g == "tool":
                parts.append(self.tool_advantages(trajs))
            else:
                info = self.step_source(trajs, tasks)
                parts.append(info.values)
                metrics.update(info.metrics)
        return Advantages([np.stack([p[i] for p in parts], axis=-1) for i in range(len(trajs))], metrics)


@register("gear_mix", source="sleuth")
def gear_mix(**kwargs: Any) -> GearMix:
    return GearMix(**kwargs)


@register("gear_gt", source="sleuth")
def gear_gt(**kwargs: Any) -> GearGT:
    return GearGT(**kwargs)
