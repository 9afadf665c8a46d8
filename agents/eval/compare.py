"""`sleuth compare RUN_A RUN_B`: two evaluation runs side by side on the tasks they share, with the
difference of each metric and its 95% paired-bootstrap confidence interval (tasks resampled with
replacement; per-task values are means over that task's samples)."""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path
from typing import Any

from sleuth.agents.eval.episodes import episode_metrics, load_trajectories
from sleuth.agents.trajectory import Trajectory

# The verifier's numbers, then two of the episode's own: the share of its turns that were invalid tool calls
# (averaged per task, so its mean is a run's `tool_error_rate_episodes`), and whether it ended by answering (1)
# or ran out of budget (0); and whether a document it read held the answer (paired on the tasks where both runs
# read a document and the answer can be a span), and whether its answer was the title of a document it was shown;
# how many valid tool calls it made, and of the turns that tried to call a tool the share that were valid.
METRICS = ("score", "em", "f1", "support_recall", "answer_read", "title_answer", "all_passed", "tool_error_share",
           "answered", "tool_calls", "valid_call_share")


def per_task(trajs: list[Trajectory]) -> dict[str, dict[str, float]]:
    acc: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for t in trajs:
        if t.failed:
            continue
        m = episode_metrics(t)
        for key in METRICS:
            if key in m:
                acc[t.task_id][key].append(m[key])
    return {tid: {k: sum(v) / len(v) for k, v in m.items()} for tid, m in acc.items()}


def bootstrap_ci(diffs: list[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    n = len(diffs)
    means = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    return means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def compare(run_a: str | Path, run_b: str | Path, resamples: int = 2000) -> dict[str, Any]:
    a = per_task(load_trajectories(Path(run_a) / "trajectories.jsonl"))
    b = per_task(load_trajectories(Path(run_b) / "trajectories.jsonl"))
    if not a or not b:
        raise FileNotFoundError(f"no trajectories in {run_a if not a else run_b}")
    shared = sorted(set(a) & set(b))
    if not shared:
        raise ValueError(f"{run_a} ({len(a)} tasks) and {run_b} ({len(b)} tasks) share no task: a paired comparison "
                         "needs runs on the same questions (same --tasks and --limit)")
    rows = []
    for m in METRICS:
        ids = [t for t in shared if m in a[t] and m in b[t]]
        if not ids:
            continue
        diffs = [b[t][m] - a[t][m] for t in ids]
        low, high = bootstrap_ci(diffs, resamples)
        rows.append({"metric": m, "n": len(ids), "a": sum(a[t][m] for t in ids) / len(ids),
                     "b": sum(b[t][m] for t in ids) / len(ids), "diff": sum(diffs) / len(diffs),
                     "ci_low": low, "ci_high": high})
    return {"a": str(run_a), "b": str(run_b), "shared_tasks": len(shared), "only_a": len(set(a) - set(b)),
            "only_b": len(set(b) - set(a)), "rows": rows}


def to_markdown(result: dict[str, Any]) -> str:
    lines = [f"A = `{result['a']}`, B = `{result['b']}`: {result['shared_tasks']} shared tasks "
             f"({result['only_a']} only in A, {result['only_b']} only in B).", "",
             "| metric | n | A | B | B − A | 95% CI (paired bootstrap) |", "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        mark = " *" if r["ci_low"] > 0 or r["ci_high"] < 0 else ""
        lines.append(f"| {r['metric']} | {r['n']} | {r['a']:.3f} | {r['b']:.3f} | {r['diff']:+.3f}{mark} | "
                     f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] |")
    lines += ["", "`*`: the interval excludes 0.", "",
              "Task by task, side by side (B better, B worse, both failed): "
              f"`sleuth view {result['a']} {result['b']}`, then `#/compare/0/1`."]
    return "\n".join(lines)


def write_comparison_plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(rows)), 3.6))
    x = range(len(rows))
    a = ax.bar([i - 0.2 for i in x], [r["a"] for r in rows], 0.4, label="A")
    b = ax.bar([i + 0.2 for i in x], [r["b"] for r in rows], 0.4, label="B",
               yerr=[[r["b"] - (r["a"] + r["ci_low"]) for r in rows], [(r["a"] + r["ci_high"]) - r["b"] for r in rows]],
               capsize=3)
    for bars in (a, b):
        ax.bar_label(bars, fmt="%.2f", fontsize=7, label_type="center")  # zeros stay visible
    ax.set_xticks(list(x), [r["metric"] for r in rows])
    ax.set_ylim(0, max([1.1, *(1.1 * max(r["a"], r["b"]) for r in rows)]))  # counts (tool_calls) exceed 1
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, never over them
    ax.set_title("B vs A (error bars: 95% CI of B − A, placed on B)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
