"""A training step's metrics: every rank's numbers gathered into one row (`step_row`), and the words the
trainer uses about them (why a step had no learning signal, which steps)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sleuth.agents.trajectory import Trajectory
from sleuth.training.metrics import describe
from sleuth.training.rl.update import UpdateStats
from sleuth.training.rollout.asynchronous import StreamStats


@dataclass
class BranchCount:
    """One rank's groups of branches of one kind (`branches.answer`, `branches.demo`) over a step: the
    reward of each branch that did not fail, the groups judged, those of them with no learning signal, and the
    branches that failed."""

    rewards: list[float] = field(default_factory=list)
    groups: int = 0
    no_signal: int = 0
    failed: int = 0


@dataclass
class Outage:
    """A step whose every episode failed on infrastructure, sampled again (`rollout.outage_retries`): the retries
    it took (alike on every rank), this rank's episodes of the attempts dropped, and the seconds waited before them."""

    retries: int = 0
    failed: int = 0
    wait_s: float = 0.0


@dataclass
class StepPart:
    """One rank's share of a training step, gathered from every rank into the step's row."""

    update: UpdateStats
    rewards: list[float]  # per episode that did not fail
    truncated: list[float]
    success: list[float]  # reward > 0
    length_correct: list[int]  # policy tokens of the episodes with reward > 0
    length_wrong: list[int]
    components: dict[str, list[float]]  # verdict details and estimator metrics, per episode
    adv: list[float]  # per policy token, the advantage the loss used
    groups: int
    zero_var: dict[str, int]  # groups whose members all scored alike: "correct" / "wrong"
    no_signal_groups: int
    gen_tokens: int
    failed: int  # episodes; a failed branch counts in its `BranchCount`
    dropped_failed: int
    reissued: int
    stream: StreamStats | None  # asynchronous training: what the stream's take dropped and how stale it was
    # the episodes' metrics above leave branches out: these count them (`branches.answer`, `branches.demo`)
    branches: BranchCount = field(default_factory=BranchCount)
    demos: BranchCount = field(default_factory=BranchCount)
    outage: Outage = field(default_factory=Outage)


def step_row(parts: list[StepPart], times: dict[str, float], sync: dict[str, float], rollout_is: bool,
             policy_version: int, group_size: int) -> dict[str, Any]:
    """One step's metrics row (every name the trainer logs) from every rank's part, the stage times and the
    sync check."""
    def cat(key: str) -> list[float]:
        return [x for p in parts for x in getattr(p.update, key)]

    def mean(v: Sequence[float], empty: float = float("nan")) -> float:
        return float(np.mean(v)) if len(v) else empty

    row: dict[str, Any] = {}
    row.update(describe("reward", [x for p in parts for x in p.rewards]))
    comps: dict[str, list[float]] = {}
    for p in parts:
        for k, v in p.components.items():
            comps.setdefault(k, []).extend(v)
    for k, v in comps.items():
        row.update(describe(f"reward/{k}", v))
    row.update(describe("adv", [x for p in parts for x in p.adv], ("mean", "absmax")))
    for k in ("policy", "kl", "entropy", "mix", "distill"):  # numerators over the global denominator: summed over ranks
        row[f"loss/{k}"] = sum(getattr(p.update, f"loss_{k}") for p in parts)
    first = parts[0].update
    row["grad_norm"] = first.grad_norm
    row["optimizer_steps"] = first.optimizer_steps
    for k, w in enumerate(first.mix_weights):  # gear_mix: mean weight per granularity
        row[f"mix/w{k}"] = w
    row.update(describe("kl", cat("kl"), ("mean",)))
    row.update(describe("entropy", cat("entropy"), ("mean",)))
    for k in ("low", "high", "dual"):
        row[f"clip/{k}"] = mean(cat(f"clip_{k}"))
    row.update(describe("ratio", cat("ratio"), ("p50", "p99", "max")))
    # tokens whose |log π_θ − log π_old| passed losses.LOG_RATIO_CLAMP: their ratio is wrong
    row["clip/log_ratio_clamp"] = mean(cat("log_ratio_clamped"))
    ess = cat("group_ess")  # per group, normalised to (0, 1]: see update.group_ess
    row["groups/ess_mean"] = mean(ess)
    row["groups/ess_min"] = float(np.min(ess)) if ess else float("nan")
    row["ppo_kl"] = -mean(cat("log_ratio"))  # verl's ppo_kl: mean of log π_old − log π_θ over the update's tokens
    if rollout_is:
        row.update(describe("is_weight", cat("is_weight"), ("mean", "max")))
        row["is/clipped"] = mean(cat("is_clipped"), 0.0)
        row["is/masked"] = mean(cat("is_masked"), 0.0)
    row.update(describe("mismatch", cat("mismatch"), ("mean", "p99", "max")))
    if "teacher" in times:
        row.update(distill_metrics(cat("distill_kl"), cat("distill_turn"), cat("distill_signal"), times["teacher"]))
    n_groups = max(sum(p.groups for p in parts), 1)
    zv: Counter[str] = Counter()
    for p in parts:
        zv.update(p.zero_var)
    row["groups/zero_var_correct"] = zv["correct"] / n_groups
    row["groups/zero_var_wrong"] = zv["wrong"] / n_groups
    row["groups/zero_var"] = (zv["correct"] + zv["wrong"]) / n_groups
    row["groups/zero_var_expected"] = expected_zero_variance([x for p in parts for x in p.success], group_size)
    row["groups/no_signal"] = sum(p.no_signal_groups for p in parts) / n_groups
    # every episode this step sampled, failed ones and extra `dynamic` rounds included: the rollout budget
    # (episodes, not steps) that equal-budget comparisons sum over a run
    row["episodes/sampled"] = sum(len(p.rewards) + p.failed for p in parts)
    row["episodes/failed"] = sum(p.failed for p in parts)
    row["groups/dropped_failed"] = sum(p.dropped_failed for p in parts)
    row["groups/reissued"] = sum(p.reissued for p in parts)
    # an outage: the step sampled again this many times; the episodes of the attempts dropped are in no count above
    row["outage/retries"] = parts[0].outage.retries
    row["outage/failed_episodes"] = sum(p.outage.failed for p in parts)
    row["outage/wait_s"] = parts[0].outage.wait_s
    for name, counts in (("branches", [p.branches for p in parts]), ("demos", [p.demos for p in parts])):
        rewards = [x for c in counts for x in c.rewards]
        if rewards or any(c.groups or c.failed for c in counts):  # only where the run samples that kind
            row[f"{name}/sampled"] = len(rewards) + sum(c.failed for c in counts)
            row.update(describe(f"{name}/reward", rewards, ("mean",)))
            row[f"{name}/no_signal"] = sum(c.no_signal for c in counts) / max(sum(c.groups for c in counts), 1)
    row["length/correct"] = mean([x for p in parts for x in p.length_correct])
    row["length/wrong"] = mean([x for p in parts for x in p.length_wrong])
    row["truncation_rate"] = mean([x for p in parts for x in p.truncated], 0.0)
    row["tokens_per_s/rollout"] = sum(p.gen_tokens for p in parts) / max(times["rollout"], 1e-9)
    row["tokens_per_s/update"] = sum(p.update.train_tokens for p in parts) / max(times["update"], 1e-9)
    row.update({f"time/{k}": v for k, v in times.items() if k != "teacher"})  # the teacher's: distill/teacher_s
    row.update(sync)
    row["policy_version"] = policy_version
    streams = [p.stream for p in parts if p.stream is not None]
    if streams:  # asynchronous training: what the staleness bound dropped, and how stale the rest was
        ages = [a for s in streams for a in s.staleness]
        row["async/dropped"] = sum(s.dropped for s in streams)
        row["async/partial"] = sum(s.partial for s in streams)
        row["async/staleness_mean"] = mean(ages)
        row["async/staleness_max"] = max(ages, default=0)
    return row


def distill_metrics(kl: Sequence[float], turn: Sequence[float], signal: Sequence[float],
                    teacher_s: float) -> dict[str, float]:
    """On-policy distillation's row: the sampled-token reverse KL log π_s − log π_T per token (its mean is an
    estimate of KL(π_s ‖ π_T) per token), overall and per turn of the episode; the share of policy tokens the
    teacher scored; the seconds the teacher took."""
    kl_a, turn_a = np.asarray(kl, dtype=np.float64), np.asarray(turn, dtype=np.float64)
    row = {"distill/reverse_kl": float(kl_a.mean()) if kl_a.size else float("nan"),
           "distill/signal_share": float(np.mean(signal)) if len(signal) else float("nan"),
           "distill/teacher_s": teacher_s}
    for k in np.unique(turn_a):
        row[f"distill/reverse_kl/turn_{int(k)}"] = float(kl_a[turn_a == k].mean())
    return row


def expected_zero_variance(success: Sequence[float], group_size: int) -> float:
    """p^G + (1 − p)^G: the share of groups of G whose members all succeed or all fail when every episode
    succeeds independently with the step's success rate p (reward > 0). A measured share above it says the
    tasks differ in difficulty (some always solved, some never), which more episodes per group cannot fix."""
    if not success:
        return float("nan")
    p = float(np.mean(success))
    return p**group_size + (1.0 - p) ** group_size


def components(trajs: Sequence[Trajectory]) -> dict[str, list[float]]:
    """Numeric verdict details (em, f1, support recall, ...) per trajectory, for reward-component metrics."""
    out: dict[str, list[float]] = {}
    for t in trajs:
        for k, v in (t.verdict.details if t.verdict else {}).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out.setdefault(k, []).append(float(v))
    return out


def why_no_signal(row: dict[str, Any]) -> str:
    if not np.isfinite(row["adv/absmax"]):
        return "no trajectory was left to train on"
    if not row["adv/absmax"] > 0:
        zv = row["groups/zero_var_correct"] + row["groups/zero_var_wrong"]
        n = row["groups/dropped_failed"]
        failed = f", {n} left out for a failed episode" if n else ""
        return f"every advantage was 0; {zv:.0%} of the groups scored alike{failed}"
    return "the gradient was exactly 0"


def ranges(steps: Sequence[int]) -> str:
    """1, 2, 3, 5 → "1-3, 5"."""
    out: list[list[int]] = []
    for s in steps:
        if out and s == out[-1][1] + 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in out)
