"""Contribution-weighted group advantages.

`cw_grpo` (the published form): a judge scores each non-final round t of a trajectory with u_t (the
round retrieved something useful and new) and v_t (its reasoning is supported), c_t = u_t·v_t, and the
contributions are normalised over the K non-final rounds: c̃ = softmax(γ·c) for γ < 10 (a larger γ is
sharper: γ = 5, c = (1, 0, 0) gives ≈ (0.987, 0.007, 0.007)), and for γ ≥ 10 the hard limit
c̃ = c / max(Σc, 1e-6), as the authors' code does: where no round contributed (Σc = 0) every non-final
round gets weight 0, so a success whose rounds retrieved nothing useful trains only its final round. The
outcome GRPO advantage A stays on the final round; if A > 0 round t's tokens
get A·K·c̃_t (so the mean over the non-final rounds is still A); if A ≤ 0 nothing changes. The judge runs
only on trajectories with A > 0.

`cw_grpo_adv` (sleuth's variant): step advantages s_{i,t} = g_{i,t} − mean(g) from step rewards g (e.g.
information gain, over the group's read turns); a trajectory's raw contribution is φ_i = (fraction of its
read turns with s > 0) × (mean of its positive s); it is normalised within the group, φ̃_i = φ_i / mean_j φ_j
(1 for all when no trajectory contributes), and clipped to `phi_clip`. With c_i = R_i − mean_j R_j:
A_i = φ̃_i·c_i for a success (c_i > 0: reading that helped is amplified) and A_i = c_i/φ̃_i for a failure
(c_i < 0: a failure that still read useful documents is penalised less, one that read nothing useful more).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from sleuth.agents.trajectory import Trajectory
from sleuth.rewards.base import (
    Advantages,
    Estimator,
    groups,
    outcome,
    per_token,
    per_turn,
    register,
)
from sleuth.rewards.group import GroupOutcome
from sleuth.rewards.info_gain import InfoGain, read_documents
from sleuth.tasks.qa import qa_docs


class Judge(Protocol):
    def __call__(self, traj: Trajectory, task: Any) -> list[tuple[float, float]]: ...


class RuleJudge:
    """For QA envs: u_t = 1 if round t read a gold supporting document not read before; v_t = 1 if the
    round's text (action and what it returned) mentions the answer or a gold supporting title."""

    def __call__(self, traj: Trajectory, task: Any) -> list[tuple[float, float]]:
        gold = set(qa_docs(task, missing_ok=True).supporting)
        entities = [e.lower() for e in (*gold, task.answer, *task.aliases) if e]
        seen: set[Any] = set()
        out = []
        for turn in traj.turns[:-1]:
            read = turn.read if not turn.error else None
            u = float(read is not None and read.title in gold and read.doc not in seen)
            if read is not None:
                seen.add(read.doc)
            text = f"{turn.action_text}\n{turn.observation}".lower()
            v = float(any(e in text for e in entities))
            out.append((u, v))
        return out


JUDGE_PROMPT = (
    "You grade one step of a research agent answering a question from documents.\n"
    "Question: {question}\nGold answer: {answer}\n\nThe step (the agent's action, then what it got back):\n"
    "{step}\n\nAnswer two lines exactly:\nuseful: yes|no   (did this step retrieve useful, new information?)\n"
    "supported: yes|no   (is the step's reasoning supported by the evidence?)"
)


class LLMJudge:
    """Any policy backend (`sleuth.agents.policies.base.load_policy` spec) as the judge, with JUDGE_PROMPT; an
    unparsable reply counts as 0."""

    def __init__(self, policy: str = "smollm2", max_tokens: int = 16):
        from sleuth.agents.chat import ChatRenderer
        from sleuth.agents.policies.base import SamplingParams
        from sleuth.agents.policies.load import load_policy

        self.policy = load_policy(policy)
        self.renderer = ChatRenderer(self.policy.tokenizer)
        self.sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0)

    def __call__(self, traj: Trajectory, task: Any) -> list[tuple[float, float]]:
        from sleuth.agents.policies.base import Request

        reqs = []
        for turn in traj.turns[:-1]:
            msgs = [{"role": "user", "content": JUDGE_PROMPT.format(
                question=task.question, answer=task.answer,
                step=f"{turn.action_text}\n---\n{turn.observation[:1500]}")}]
            reqs.append(Request(self.renderer.prompt_ids(msgs), msgs, task))
        return [_parse_judgement(g.text) for g in self.policy.generate(reqs, self.sampling)] if reqs else []


def _parse_judgement(text: str) -> tuple[float, float]:
    low = text.lower()

    def flag(key: str) -> float:
        at = low.find(key)
        return float(at >= 0 and low[at + len(key):].lstrip(" :*").startswith("yes"))

    return flag("useful"), flag("supported")


def normalise(c: Sequence[float], gamma: float) -> np.ndarray:
    c = np.asarray(c, dtype=np.float64)
    if c.size == 0:
        return c
    if gamma >= 10:
        return c / max(float(c.sum()), 1e-6)  # the authors' clamp: Σc = 0 gives every round 0
    e = np.exp(gamma * (c - c.max()))
    return e / e.sum()


class CWGRPO(Estimator):
    def __init__(self, judge: str = "rule", gamma: float = 10.0, judge_policy: str = "smollm2", eps: float = 1e-6):
        if judge not in ("rule", "llm"):
            raise ValueError(f"cw_grpo judge must be rule or llm; got {judge!r}")
        self.judge: Judge = RuleJudge() if judge == "rule" else LLMJudge(judge_policy)
        self.gamma = gamma
        self.outcome = GroupOutcome("grpo", eps)
        self.judged = 0  # trajectories the judge ran on

    def __call__(self, trajs: Sequence[Trajectory], tasks: Mapping[str, Any]) -> Advantages:
        adv = self.outcome.trajectory_advantages(trajs)
        out, judged = [], 0
        for traj, a in zip(trajs, adv, strict=True):
            k = len(traj.turns) - 1
            if a <= 0 or k == 0:
                out.append(per_token(traj, a))
                continue
            judged += 1
            c = normalise([u * v for u, v in self.judge(traj, tasks[traj.task_id])], self.gamma)
            out.append(per_turn(traj, [*(a * k * c).tolist(), a]))
        self.judged += judged
        return Advantages(out, {"cw_grpo/judged": [float(judged)]})


class CWGRPOAdv(Estimator):
    def __init__(self, step_reward: Mapping[str, Any] | None = None, phi_clip: tuple[float, float] = (0.5, 2.0)):
        self.step_source: InfoGain = InfoGain(**dict(step_reward or {}))
        self.lo, self.hi = phi_clip
        if not 0 < self.lo <= 1 <= self.hi:
            raise ValueError(f"cw_grpo_adv phi_clip must satisfy 0 < low ≤ 1 ≤ high, got {phi_clip}")

    def contributions(self, trajs: Sequence[Trajectory], steps: Sequence[Sequence[float]]) -> np.ndarray:
        """Raw φ_i (before the group normalisation)."""
        phi = np.zeros(len(trajs))
        for idx in groups(trajs).values():
            read_turns = {i: [t for t, text in read_documents(trajs[i]) if text is not None] for i in idx}
            gains = [steps[i][t] for i in idx for t in read_turns[i]]
            base = float(np.mean(gains)) if gains else 0.0
            for i in idx:
                s = np.array([steps[i][t] - base for t in read_turns[i]])
                pos = s[s > 0]
                phi[i] = (pos.size / s.size) * pos.mean() if pos.size else 0.0
        return phi

    def weights(self, trajs: Sequence[Trajectory], phi: np.ndarray) -> np.ndarray:
        """φ̃: φ divided by its group mean (1 where the group has no contribution), clipped."""
        out = np.ones(len(trajs))
        for idx in groups(trajs).values():
            mean = float(np.mean(phi[idx]))
            if mean > 0:
                out[idx] = phi[idx] / mean
        return np.clip(out, self.lo, self.hi)

    def __call__(self, trajs: Sequence[Trajectory], tasks: Mapping[str, Any]) -> Advantages:
        steps = self.step_source.step_rewards(trajs, tasks)
        phi = self.weights(trajs, self.contributions(trajs, steps))
        out = [0.0] * len(trajs)
        for idx in groups(trajs).values():
            r = np.array([outcome(trajs[i]) for i in idx])
            for i, centred in zip(idx, r - r.mean(), strict=True):
                out[i] = phi[i] * centred if centred > 0 else centred / phi[i]
        metrics = {**self.step_source.step_metrics(trajs, steps), "cw_grpo_adv/phi": phi.tolist()}
        return Advantages([per_token(t, a) for t, a in zip(trajs, out, strict=True)], metrics)


@register("cw_grpo", source="sleuth")
def cw_grpo(**kwargs: Any) -> CWGRPO:
    return CWGRPO(**kwargs)


@register("cw_grpo_adv", source="sleuth")
def cw_grpo_adv(**kwargs: Any) -> CWGRPOAdv:
    if "phi_clip" in kwargs:
        kwargs["phi_clip"] = tuple(kwargs["phi_clip"])
    return CWGRPOAdv(**kwargs)
