"""The ablation's report: one table per held-out set (every arm's mean with its 95% bootstrap CI, the paired
differences against the warm start and against grpo, seconds per step) and the learning curves. Kept apart
from `ablate.py` so `--report` and the tests rebuild it from finished runs without training anything."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The per-question values: the verifier's numbers, whether a document the episode read held the answer, then
# the episode's share of invalid tool calls and whether it ended by answering.
METRICS = [("em", "EM"), ("f1", "F1"), ("support_recall", "support recall"), ("answer_read", "answer read"),
           ("tool_error_share", "tool-call error rate"), ("answered", "answered")]
BASELINE = "grpo"
WARM = "warm start (no RL)"
Questions = dict[str, dict[str, float]]  # task id → metric → value


@dataclass(frozen=True)
class HeldOut:
    """A held-out question set every arm and the warm start are evaluated on: the first `limit` of `spec`."""
    name: str
    spec: str
    limit: int

    def describe(self) -> str:
        return f"the first {self.limit} questions of `{self.spec}`"


def eval_dir(run: Path, held: HeldOut) -> Path:
    return run / f"eval-{held.name}"


def evaluated(run: Path, sets: list[HeldOut]) -> bool:
    """Whether `run` has a finished evaluation on every held-out set."""
    return all((eval_dir(run, h) / "summary.json").exists() for h in sets)


def metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def per_question(eval_path: Path) -> Questions:
    from sleuth.agents.eval.compare import per_task
    from sleuth.agents.eval.episodes import load_trajectories

    return per_task(load_trajectories(eval_path / "trajectories.jsonl"))


def row(name: str, run: Path, sets: list[HeldOut]) -> dict[str, Any]:
    """An arm's report row: its per-question values on every held-out set, its mean seconds per step by stage
    and its per-step training curves."""
    m = metrics(run)
    cost = {k: sum(r.get(f"time/{k}", 0.0) for r in m) / max(len(m), 1) for k in ("rollout", "reward", "update")}
    return {"variant": name, "questions": {h.name: per_question(eval_dir(run, h)) for h in sets}, "cost": cost,
            "reward_curve": [r.get("reward/mean", 0.0) for r in m],
            "support_curve": [r.get("reward/support_recall/mean", 0.0) for r in m]}


def mean_ci(values: list[float]) -> tuple[float, float, float]:
    from sleuth.agents.eval.compare import bootstrap_ci

    return sum(values) / len(values), *bootstrap_ci(values)


def diff_cell(q: Questions, ref: Questions, key: str, ids: list[str], label: str) -> str:
    """The paired difference against a reference run on the questions both have, with its bootstrap CI."""
    from sleuth.agents.eval.compare import bootstrap_ci

    diffs = [q[t][key] - ref[t][key] for t in ids if key in ref.get(t, {})]
    if not diffs:
        return ""
    low, high = bootstrap_ci(diffs)
    mark = "*" if low > 0 or high < 0 else ""
    return f"<br>{label} {sum(diffs) / len(diffs):+.3f}{mark} [{low:+.2f}, {high:+.2f}]"


def table(rows: list[dict[str, Any]], warm: Questions, held: str) -> list[str]:
    """The Markdown table of the warm start and every row on the held-out set named `held`."""
    head = "| estimator | " + " | ".join(label for _, label in METRICS) + " | s / step (rollout + reward + update) |"
    lines = [head, "|" + "---|" * (len(METRICS) + 2)]
    base = next((r["questions"][held] for r in rows if r["variant"] == BASELINE), None)
    for r in [{"variant": WARM, "questions": {held: warm}, "cost": None}, *rows]:
        q = r["questions"][held]
        cells = []
        for key, _ in METRICS:
            ids = sorted(t for t in q if key in q[t])
            if not ids:
                cells.append("–")
                continue
            mean, low, high = mean_ci([q[t][key] for t in ids])
            cell = f"{mean:.3f} [{low:.2f}, {high:.2f}]"
            if r["variant"] != WARM:
                cell += diff_cell(q, warm, key, ids, "vs warm")
            if base is not None and r["variant"] not in (BASELINE, WARM):
                cell += diff_cell(q, base, key, ids, f"vs {BASELINE}")
            cells.append(cell)
        c = r["cost"]
        cost = f"{sum(c.values()):.0f} ({c['rollout']:.0f} + {c['reward']:.1f} + {c['update']:.0f})" if c else "–"
        lines.append(f"| {r['variant']} | " + " | ".join(cells) + f" | {cost} |")
    return lines


def plot_curves(path: Path, rows: list[dict[str, Any]], reads: str) -> None:
    """Train reward and support recall of the training episodes' `reads` per step, one line per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in rows:
        steps = range(1, len(r["reward_curve"]) + 1)
        axes[0].plot(steps, r["reward_curve"], marker="o", label=r["variant"])
        axes[1].plot(steps, r["support_curve"], marker="o", label=r["variant"])
    axes[0].set_ylabel("train reward (mean F1 of the step's episodes)")
    axes[1].set_ylabel(f"support recall of the step's {reads}")
    for ax in axes:
        ax.set_xlabel("step")
        ax.xaxis.get_major_locator().set_params(integer=True)
    axes[1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write(out: Path, title: str, header: str, rows: list[dict[str, Any]], warm: dict[str, Questions],
          sets: list[HeldOut], reads: str = "reads") -> str:
    """Write `out/ablation.md` (the header, then one table per held-out set) and `out/curves.png`; return the
    report's body."""
    out.mkdir(parents=True, exist_ok=True)
    plot_curves(out / "curves.png", rows, reads)
    lines = [header]
    for h in sets:
        lines += ["", f"## {h.name}: {h.describe()}", "", *table(rows, warm[h.name], h.name)]
    lines += ["", "![learning curves](curves.png)"]
    report = "\n".join(lines)
    (out / "ablation.md").write_text(f"# {title}\n\n{report}\n")
    return report
