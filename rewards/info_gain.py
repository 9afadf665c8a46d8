"""Information-gain step rewards for each document read (CIGPO), and the advantage they give.

A reader (a frozen causal LM; `rewards.reader.Reader`) scores the task's answer given the question and the
documents read so far. With c_t the context after the trajectory's t-th *new* read (c_0: question only),
the step reward of the turn that made read t is a gain g_t = v(c_t) − v(c_{t−1}) or a divergence:

- `gold_prob` (IGPO, Wang et al. 2025, arXiv:2510.14967): v(c) = π(a | c)^(1/|a|), the length-normalised
  probability of the gold answer a;
- `gold_logprob`: v(c) = (1/|a|) log π(a | c);
- `entropy`: H(P_{t−1}) − H(P_t), the drop in entropy of the reader's distribution P over K candidate
  answers (P ∝ length-normalised probability; the candidates are the gold answer and up to K−1 titles of the
  task's documents: HotpotQA answers are mostly entities, so the titles are the natural confusers);
- `kl`: KL(P_t ‖ P_{t−1}) over the same candidates;
- `support`: v(c) = the share of the task's supporting documents (HotpotQA's `supporting` titles) in c, so
  a new gold read gains 1/|gold| and any other read 0. No reader: the training split's own labels measure
  the information, at no model cost, exactly where labels exist (a 135M reader hardly tells a useful
  paragraph from a distractor).
- `answer`: v(c) = 1 if a document in c holds the task's answer as a span (the env's `ReadEvent.answer`),
  else 0, so the first new read that shows the answer gains 1 and every other read 0. No reader and no
  supporting-document labels: the answer the outcome is scored against is the label, so it applies to any
  QA task with span answers; a bridge question's first hop gains nothing, its second hop (the document
  holding the answer) gains 1. A yes/no answer is never a span: those tasks get only the outcome term.

A re-read, a failed read or a read the policy never saw (the episode ended on it: `ReadEvent.shown`) adds
no document: c_t = c_{t−1}, so its gain is 0; other turns get 0. A
trajectory with T new reads costs T+1 contexts (turn t's "after" is turn t+1's "before"), and contexts
shared across a group (the question alone) are scored once.

Advantage (per turn t of trajectory i in group G), by `step_baseline`:
- `pooled` (IGPO's form): A_{i,t} = w_o · A^{outcome}_i + w_s · Σ_{k ≥ t} γ^{k−t} ĝ_{i,k},
  ĝ_{i,k} = (g_{i,k} − mean(g)) / (std(g) + ε) over the non-final turns of the group (g = 0 on turns that
  read nothing new; the final turn has ĝ = 0). Every extra turn adds one more standardised term, so where
  most reads gain less than the pool's mean, reading more is penalised by the count of reads alone.
- `turn_index`: A_{i,t} = w_o · A^{outcome}_i + w_s · (G_{i,t} − mean_j G_{j,t}) / (std_j G_{j,t} + ε), with
  G_{i,t} = Σ_{k ≥ t} γ^{k−t} g_{i,k} the raw gains still to come and the baseline taken over the group's
  trajectories that reached turn t (GiGPO's idea of comparing like with like, here by turn index). At t = 0
  it is the group-standardised total gain (for `support`: the support recall of the reads); an answer at
  turn t is compared with the members that read at turn t instead.
with A^{outcome} the group's `grpo` (or `dr_grpo`, `rloo`) advantage of the outcome reward.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sleuth.agents.trajectory import Trajectory
from sleuth.rewards.base import (
    Advantages,
    Estimator,
    discounted_returns,
    groups,
    per_turn,
    register,
)
from sleuth.rewards.group import GroupOutcome
from sleuth.tasks.qa import qa_docs
from sleuth.verifiers.qa import answer_spans, gold_answers

VARIANTS = ("gold_prob", "gold_logprob", "entropy", "kl", "support", "answer")
LABEL_VARIANTS = ("support", "answer")  # measured by the task's labels: no reader model
BASELINES = ("pooled", "turn_index")


def read_documents(traj: Trajectory) -> list[tuple[int, str | None]]:
    """(turn index, new document text or None) for each read turn: None for re-reads, failed reads and
    reads whose document the policy never saw."""
    out, seen = [], set()
    for t, turn in enumerate(traj.turns):
        read = turn.read
        if read is None or turn.error:
            continue
        new = read.doc not in seen and not read.reread and read.shown
        seen.add(read.doc)
        out.append((t, turn.observation if new else None))
    return out


class InfoGain(Estimator):
    # An agent's reads are recognised in its tool results by the gateway (`agents.gateway.reads`); its step rewards
    # price the turns of one token sequence, so an episode split into segments is refused.
    supports_agents = True
    def __init__(self, variant: str = "gold_prob", reader: Any = "smollm2", candidates: int = 8,
                 step_weight: float = 1.0, outcome_weight: float = 1.0, gamma: float = 1.0, outcome: str = "grpo",
                 eps: float = 1e-6, refresh_every: int = 0, step_baseline: str = "pooled"):
        if variant not in VARIANTS:
            raise ValueError(f"info_gain variant must be one of {', '.join(VARIANTS)}; got {variant!r}")
        if step_baseline not in BASELINES:
            raise ValueError(f"info_gain step_baseline must be one of {', '.join(BASELINES)}; got {step_baseline!r}")
        self.step_baseline = step_baseline
        if variant in LABEL_VARIANTS:
            reader = None  # the labels are the measure: no model to load
        elif isinstance(reader, str):
            from sleuth.rewards.reader import Reader

            reader = Reader(reader)
        if refresh_every < 0:
            raise ValueError(f"info_gain refresh_every must be ≥ 0, got {refresh_every}")
        self.reader, self.variant, self.candidates = reader, variant, candidates
        self.step_weight, self.outcome_weight, self.gamma, self.eps = step_weight, outcome_weight, gamma, eps
        self.outcome = GroupOutcome(outcome, eps)
        self.refresh_every = refresh_every  # > 0: the trainer hands the policy's weights every N steps

    def refresh_due(self, step: int) -> bool:
        return self.reader is not None and self.refresh_every > 0 and step % self.refresh_every == 0

    def refresh(self, state: Mapping[str, Any]) -> None:
        """Make the reader a snapshot of the policy (same architecture: name the policy's model as reader)."""
        self.reader.model.load_state_dict(dict(state), strict=False)
        self.reader.clear_cache()

    def check_policy(self, tokenizer: Any) -> None:
        """A reader that becomes a snapshot of the policy must be the policy's architecture and vocabulary."""
        if (self.reader is not None and self.refresh_every
                and self.reader.tokenizer.get_vocab() != tokenizer.get_vocab()):
            raise ValueError("info_gain refresh_every > 0 loads the policy's weights into the reader, but the reader's "
                             "tokenizer is not the policy's: name the policy's model as the reader")

    # -- step rewards -------------------------------------------------------------------------------
    def step_rewards(self, trajs: Sequence[Trajectory], tasks: Mapping[str, Any]) -> list[list[float]]:
        """One reward per turn of each trajectory (the gain on read turns, 0 elsewhere)."""
        if self.variant == "support":
            return [self._support_rewards(traj, tasks[traj.task_id]) for traj in trajs]
        if self.variant == "answer":
            return [self._answer_rewards(traj, tasks[traj.task_id]) for traj in trajs]
        plans = []
        pairs: list[tuple[str, str]] = []
        for traj in trajs:
            task = tasks[traj.task_id]
            reads = read_documents(traj)
            docs: list[str] = []
            prompts = [self.reader.prompt(task.question, docs)]
            for _, text in reads:
                if text is not None:
                    docs.append(text)
                    prompts.append(self.reader.prompt(task.question, docs))
            answers = self._candidates(task)
            plans.append((reads, prompts, answers))
            pairs += [(p, a) for p in prompts for a in answers]
        scores = iter(self.reader.score(pairs))
        out = []
        for traj, (reads, prompts, answers) in zip(trajs, plans, strict=True):
            values = [self._value([next(scores) for _ in answers]) for _ in prompts]
            rewards = [0.0] * len(traj.turns)
            k = 0
            for turn, text in reads:
                if text is not None:
                    rewards[turn] = self._gain(values[k], values[k + 1])
                    k += 1
            out.append(rewards)
        return out

    @staticmethod
    def _support_rewards(traj: Trajectory, task: Any) -> list[float]:
        gold = set(qa_docs(task, missing_ok=True).supporting)
        if not gold:
            raise ValueError(f"info_gain variant 'support' needs the task's supporting titles; "
                             f"task {task.id!r} has none")
        rewards = [0.0] * len(traj.turns)
        for turn, text in read_documents(traj):
            read = traj.turns[turn].read
            if text is not None and read is not None and read.title in gold:
                rewards[turn] = 1.0 / len(gold)
        return rewards

    @staticmethod
    def _answer_rewards(traj: Trajectory, task: Any) -> list[float]:
        rewards = [0.0] * len(traj.turns)
        if not answer_spans(gold_answers(task)):
            return rewards  # yes / no: no document can hold it
        for turn, text in read_documents(traj):
            read = traj.turns[turn].read
            if text is None or read is None:
                continue
            if read.answer is None:
                raise ValueError(f"info_gain variant 'answer' needs read events that say whether their "
                                 f"document holds the answer (ReadEvent.answer); {traj.env_id} reported none "
                                 f"on task {task.id!r}")
            if read.answer:
                rewards[turn] = 1.0
                break
        return rewards

    def _candidates(self, task: Any) -> list[str]:
        if self.variant in ("gold_prob", "gold_logprob"):
            return [task.answer]
        norm = task.answer.strip().lower()
        titles = [t for t in qa_docs(task, missing_ok=True).titles if t.strip().lower() != norm]
        return [task.answer, *list(dict.fromkeys(titles))[: self.candidates - 1]]

    def _value(self, scored: list[tuple[float, int]]) -> Any:
        mean_lp = np.array([s / max(n, 1) for s, n in scored])
        if self.variant == "gold_logprob":
            return float(mean_lp[0])
        if self.variant == "gold_prob":
            return math.exp(float(mean_lp[0]))
        p = np.exp(mean_lp - mean_lp.max())
        return p / p.sum()

    def _gain(self, before: Any, after: Any) -> float:
        if self.variant in ("gold_prob", "gold_logprob"):
            return after - before
        if self.variant == "entropy":
            return float(_entropy(before) - _entropy(after))
        return float(np.sum(after * (np.log(after + 1e-12) - np.log(before + 1e-12))))

    def step_metrics(self, trajs: Sequence[Trajectory], steps: Sequence[Sequence[float]]) -> dict[str, list[float]]:
        """The step rewards of every read turn, for the trainer's metrics."""
        gains = [steps[i][t] for i, traj in enumerate(trajs) for t, _ in read_documents(traj)]
        return {f"step/info_gain/{self.variant}": gains}

    # -- advantages ---------------------------------------------------------------------------------
    def __call__(self, trajs: Sequence[Trajectory], tasks: Mapping[str, Any]) -> Advantages:
        steps = self.step_rewards(trajs, tasks)
        outcome = self.outcome.trajectory_advantages(trajs)
        step_term = self._pooled(trajs, steps) if self.step_baseline == "pooled" else self._turn_index(trajs, steps)
        values = [per_turn(t, (self.outcome_weight * outcome[i] + self.step_weight * step_term[i]).tolist())
                  for i, t in enumerate(trajs)]
        return Advantages(values, self.step_metrics(trajs, steps))

    def _pooled(self, trajs: Sequence[Trajectory], steps: list[list[float]]) -> list[np.ndarray]:
        norm = [np.zeros(len(t.turns)) for t in trajs]
        for idx in groups(trajs).values():
            # The pool is every non-final turn of the group (a turn that read nothing new has gain 0), so a
            # lone useful read still stands out and turns that read nothing are ranked below reading ones.
            pool = [steps[i][t] for i in idx for t in range(len(trajs[i].turns) - 1)]
            if len(pool) < 2 or float(np.std(pool)) == 0.0:
                continue
            mean, std = float(np.mean(pool)), float(np.std(pool))
            for i in idx:
                for t in range(len(trajs[i].turns) - 1):
                    norm[i][t] = (steps[i][t] - mean) / (std + self.eps)
        return [discounted_returns(n, self.gamma) for n in norm]

    def _turn_index(self, trajs: Sequence[Trajectory], steps: list[list[float]]) -> list[np.ndarray]:
        returns = [discounted_returns(np.asarray(s, dtype=np.float64), self.gamma) for s in steps]
        out = [np.zeros(len(t.turns)) for t in trajs]
        for idx in groups(trajs).values():
            for t in range(max(len(trajs[i].turns) for i in idx)):
                members = [i for i in idx if len(trajs[i].turns) > t]
                pool = np.array([returns[i][t] for i in members])
                if len(pool) < 2 or float(pool.std()) == 0.0:
                    continue
                for i in members:
                    out[i][t] = (returns[i][t] - pool.mean()) / (pool.std() + self.eps)
        return out


def _entropy(p: np.ndarray) -> float:
    return float(-np.sum(p * np.log(p + 1e-12)))


@register("info_gain", source="sleuth")
def info_gain(**kwargs: Any) -> InfoGain:
    return InfoGain(**kwargs)
