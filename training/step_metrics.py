"""A training step's metrics: every rank's numbers gathered into one row (`step_row`), and the words the
trainer uses about them (why a step had no learning signal, which steps)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from sleuth.agents.trajectory import Trajectory
from sleuth.training.metrics import describe


def step_row(parts: list[dict[str, Any]], times: dict[str, float], sync: dict[str, float], rollout_is: bool,
             policy_version: int, group_size: int) -> dict[str, Any]:
    """One step's metrics row from every rank's part (`parts`, gathered), the stage times and the sync check."""
    cat = lambda k: [x for p in parts for x in p.get(k, [])]  # noqa: E731
    row: dict[str, Any] = {}
    row.update(describe("reward", cat("rewards")))
    comps: dict[str, list[float]] = {}
    for p in parts:
        for k, v in p["components"].items():
            comps.setdefault(k, []).extend(v)
    for k, v in comps.items():
        row.update(describe(f"reward/{k}", v))
    adv = cat("adv")
    row.update(describe("adv", adv, ("mean", "absmax")))
    for k in ("policy", "kl", "entropy", "mix"):  # numerators over the global denominator: summed over ranks
        row[f"loss/{k}"] = sum(p.get(f"loss/{k}", 0.0) for p in parts)
    row["grad_norm"] = parts[0].get("grad_norm", float("nan"))
    row["optimizer_steps"] = parts[0].get("optimizer_steps", 0)
    for k, w in enumerate(parts[0].get("mix_weights", [])):  # gear_mix: mean weight per granularity
        row[f"mix/w{k}"] = w
    row.update(describe("kl", cat("kl"), ("mean",)))
    row.update(describe("entropy", cat("entropy"), ("mean",)))
    for k in ("low", "high", "dual"):
        v = cat(f"clip_{k}")
        row[f"clip/{k}"] = float(np.mean(v)) if v else float("nan")
    row.update(describe("ratio", cat("ratio"), ("p50", "p99", "max")))
    # tokens whose |log π_θ − log π_old| passed losses.LOG_RATIO_CLAMP: their ratio is wrong
    clamped = cat("log_ratio_clamped")
    row["clip/log_ratio_clamp"] = float(np.mean(clamped)) if clamped else float("nan")
    ess = cat("group_ess")  # per group, normalised to (0, 1]: see update.group_ess
    row["groups/ess_mean"] = float(np.mean(ess)) if ess else float("nan")
    row["groups/ess_min"] = float(np.min(ess)) if ess else float("nan")
    log_ratio = cat("log_ratio")  # verl's ppo_kl: mean of log π_old − log π_θ over the update's tokens
    row["ppo_kl"] = -float(np.mean(log_ratio)) if log_ratio else float("nan")
    if rollout_is:
        row.update(describe("is_weight", cat("is_weight"), ("mean", "max")))
        for k in ("clipped", "masked"):
            v = cat(f"is_{k}")
            row[f"is/{k}"] = float(np.mean(v)) if v else 0.0
    row.update(describe("mismatch", cat("mismatch"), ("mean", "p99", "max")))
    n_groups = sum(p["groups"] for p in parts)
    zv = Counter()
    for p in parts:
        zv.update(p["zero_var"])
    row["groups/zero_var_correct"] = zv["correct"] / max(n_groups, 1)
    row["groups/zero_var_wrong"] = zv["wrong"] / max(n_groups, 1)
    row["groups/zero_var"] = (zv["correct"] + zv["wrong"]) / max(n_groups, 1)
    row["groups/zero_var_expected"] = expected_zero_variance(cat("success"), group_size)
    row["groups/no_signal"] = sum(p["no_signal_groups"] for p in parts) / max(n_groups, 1)
    row["episodes/failed"] = sum(p["failed"] for p in parts)
    row["groups/dropped_failed"] = sum(p["dropped_failed"] for p in parts)
    row["groups/reissued"] = sum(p["reissued"] for p in parts)
    lc, lw = cat("length_correct"), cat("length_wrong")
    row["length/correct"] = float(np.mean(lc)) if lc else float("nan")
    row["length/wrong"] = float(np.mean(lw)) if lw else float("nan")
    row["truncation_rate"] = float(np.mean(cat("truncated"))) if cat("truncated") else 0.0
    row["tokens_per_s/rollout"] = sum(p["gen_tokens"] for p in parts) / max(times["rollout"], 1e-9)
    row["tokens_per_s/update"] = sum(p.get("train_tokens", 0) for p in parts) / max(times["update"], 1e-9)
    row.update({f"time/{k}": v for k, v in times.items()})
    row.update(sync)
    row["policy_version"] = policy_version
    streams = [p["stream"] for p in parts if p["stream"] is not None]
    if streams:  # asynchronous training: what the staleness bound dropped, and how stale the rest was
        ages = [a for s in streams for a in s["staleness"]]
        row["async/dropped"] = sum(s["dropped"] for s in streams)
        row["async/partial"] = sum(s["partial"] for s in streams)
        row["async/staleness_mean"] = float(np.mean(ages)) if ages else float("nan")
        row["async/staleness_max"] = max(ages, default=0)
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
