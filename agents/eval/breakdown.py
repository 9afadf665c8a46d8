"""Beyond the mean: pass@k with the unbiased estimator, and metrics broken down by a task field."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from math import comb
from typing import Any

from sleuth.agents.trajectory import Trajectory
from sleuth.tasks.base import Task

# task fields worth a breakdown when present (HotpotQA type/level; data set of MBPP/HumanEval/... tasks)
FIELDS = ("source", "type", "level", "package")  # package: the PyPI package of a SWE task


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k samples drawn without replacement from n is correct), c of n correct
    (Chen et al., 2021): 1 - C(n - c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def solved(t: Trajectory) -> bool:
    """Full marks: EM for QA, every test for code."""
    return not t.failed and t.verdict is not None and t.verdict.score >= 1.0


def pass_at_ks(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """pass@k for k = 1, 2, 4, ... up to the number of samples every task has."""
    by_task: dict[str, list[bool]] = defaultdict(list)
    for t in trajs:
        if not t.failed:  # no answer, so neither a success nor a failure of the policy
            by_task[t.task_id].append(solved(t))
    if not by_task:
        return {}
    n = min(len(v) for v in by_task.values())
    ks = sorted({k for k in (1, 2, 4, 8, 16, 32, 64, 100) if k <= n} | {n})
    return {f"pass@{k}": round(sum(pass_at_k(len(v), sum(v), k) for v in by_task.values()) / len(by_task), 4)
            for k in ks}


def _field(task: Task, name: str) -> Any:
    return task.source if name == "source" else task.payload.get(name)


def breakdown(trajs: Sequence[Trajectory], tasks: Sequence[Task]) -> dict[str, dict[str, dict[str, float]]]:
    """{field: {value: {"n", "score", and em/f1/support_recall/all_passed where the verdicts have them}}},
    for each field that takes at least two values."""
    by_id = {t.id: t for t in tasks}
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name in FIELDS:
        groups: dict[str, list[Trajectory]] = defaultdict(list)
        for t in trajs:
            task = by_id.get(t.task_id)
            value = _field(task, name) if task else None
            if value is not None and not t.failed:
                groups[str(value)].append(t)
        if len(groups) < 2:
            continue
        out[name] = {value: _means(group) for value, group in sorted(groups.items())}
    return out


def _means(group: list[Trajectory]) -> dict[str, float]:
    row: dict[str, float] = {"n": len(group)}
    row["score"] = round(sum(t.verdict.score if t.verdict else 0.0 for t in group) / len(group), 4)
    for key in ("em", "f1", "support_recall", "all_passed", "resolved"):
        vals = [t.verdict.details.get(key) if t.verdict else None for t in group]
        if all(isinstance(v, (int, float)) for v in vals):
            row[key] = round(sum(float(v) for v in vals) / len(vals), 4)
    return row
