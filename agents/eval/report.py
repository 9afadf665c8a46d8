"""Readable reports of evaluation runs: Markdown tables plus PNG plots."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sleuth.agents.trajectory import Trajectory

_RATES = ("em", "f1", "support_recall", "all_passed", "score", "answered_rate")
_COLUMNS = ("n", "score", "em", "f1", "support_recall", "answer_read_rate", "mean_reads", "all_passed", "passed",
            "answered_rate", "tool_error_rate_turns", "n_failed", "policy_tokens", "wall_time_s")


def columns(summaries: Sequence[dict[str, Any]]) -> list[str]:
    """The table columns the runs have (QA runs show EM/F1/recall, code runs tests passed)."""
    return [c for c in _COLUMNS if any(c in s for s in summaries)]


def rates(summaries: Sequence[dict[str, Any]]) -> list[str]:
    """The 0..1 metrics to plot; `score` only where it is not already EM or F1."""
    have = [m for m in _RATES if all(m in s for s in summaries)]
    return [m for m in have if not (m == "score" and ("f1" in have or "all_passed" in have))]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _turn_outcomes(trajs: Sequence[Trajectory]) -> dict[str, list[int]]:
    """Per turn index: how many turns read a gold doc, read a distractor, ran code, failed, or answered."""
    width = max((len(t.turns) for t in trajs), default=0)
    kinds = {k: [0] * width for k in ("gold read", "distractor read", "run", "error", "answer")}
    for t in trajs:
        for i, turn in enumerate(t.turns):
            if turn.error:
                kinds["error"][i] += 1
            elif turn.read:
                kinds["gold read" if turn.read.gold else "distractor read"][i] += 1
            elif turn.info.get("run"):
                kinds["run"][i] += 1
            elif turn.tool_call:
                kinds["answer"][i] += 1
    return kinds


def _table(rows: Sequence[dict[str, Any]], columns: Sequence[str], label: str) -> str:
    head = f"| {label} | " + " | ".join(columns) + " |"
    sep = "|---" * (len(columns) + 1) + "|"
    lines = [head, sep]
    for r in rows:
        lines.append(f"| {r.get(label, '')} | " + " | ".join(_fmt(r.get(c, '')) for c in columns) + " |")
    return "\n".join(lines)


def _fmt(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def write_report(out: Path, summary: dict[str, Any], trajs: Sequence[Trajectory]) -> None:
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    metrics = rates([summary])
    bars = a.bar(metrics, [summary[m] for m in metrics], color="#4c72b0")
    a.bar_label(bars, fmt="%.2f", fontsize=8)  # a zero is a visible "0.00", not a missing bar
    a.set_ylim(0, 1.1)
    a.set_title(f"{summary['policy']} on {summary.get('tasks', '')} (n={summary['n']})")
    kinds = _turn_outcomes([t for t in trajs if not t.failed])
    bottom = [0] * len(next(iter(kinds.values()), []))
    for kind, counts in kinds.items():
        if not any(counts):
            continue
        b.bar([str(i + 1) for i in range(len(counts))], counts, bottom=bottom, label=kind)
        bottom = [x + y for x, y in zip(bottom, counts, strict=True)]
    b.set_xlabel("turn")
    b.set_ylabel("episodes")
    b.set_title("what each turn did")
    if any(any(c) for c in kinds.values()):  # no episode ran: an empty panel, no legend
        b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "report.png", dpi=110)
    plt.close(fig)

    lines = [f"# Evaluation: {summary['policy']} on {summary.get('env', '')}", "",
             f"Tasks `{summary.get('tasks', '')}`, harness `{summary.get('harness', '')}`, "
             f"wall time {summary['wall_time_s']} s.", "",
             _table([{**summary, "policy": summary["policy"]}], columns([summary]), "policy"), "",
             "![report](report.png)", "",
             "## First episodes", ""]
    for t in [t for t in trajs if not t.failed][:3]:
        score = t.verdict.score if t.verdict else 0.0
        lines.append(f"- task `{t.task_id}` — score {score:.2f}, stop: {t.stop_reason}")
        for i, turn in enumerate(t.turns):
            action = turn.action_text.strip().replace("\n", " ")[:120]
            note = f" → error: {turn.error}" if turn.error else ""
            lines.append(f"  {i + 1}. `{action}`{note}")
    stops = summary.get("stop_reasons") or {}
    if stops:  # why episodes ended: a run of refused replies (`invalid_actions`) or a `timeout` shows here
        lines += ["", "Episodes ended by: " + ", ".join(f"{k or 'unknown'} {v}" for k, v in stops.items()) + "."]
    passes = {k: v for k, v in summary.items() if k.startswith("pass@")}
    if passes and summary.get("samples", 1) > 1:
        lines += ["", "## pass@k (unbiased estimator)", "", "| " + " | ".join(passes) + " |",
                  "|---" * len(passes) + "|", "| " + " | ".join(f"{v:.3f}" for v in passes.values()) + " |"]
    for field, groups in summary.get("breakdown", {}).items():
        cols = [c for c in ("n", "score", "em", "f1", "support_recall", "all_passed")
                if c in next(iter(groups.values()))]
        lines += ["", f"## By {field}", "", _table([{field: v, **m} for v, m in groups.items()], cols, field)]
    failed = [t for t in trajs if t.failed]
    if failed:
        lines += ["", f"## {len(failed)} episodes failed (not scored; run the same command again to retry them)", ""]
        lines += [f"- `{t.task_id}` ({t.stop_reason}): {t.error}" for t in failed]
    (out / "report.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_comparison(out: Path, summaries: Sequence[dict[str, Any]]) -> str:
    """A table and a grouped bar chart over several runs; returns the Markdown table."""
    rows = [{**s, "run": s.get("run", s["policy"])} for s in summaries]
    table = _table(rows, columns(rows), "run")
    metrics = rates(rows)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(rows)), 3.8))
    width = 0.8 / len(metrics)
    for k, metric in enumerate(metrics):
        bars = ax.bar([i + k * width for i in range(len(rows))], [r[metric] for r in rows], width, label=metric)
        ax.bar_label(bars, fmt="%.2f", fontsize=6, rotation=90, padding=2)  # zeros stay visible
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], [r["run"] for r in rows], fontsize=8)
    ax.set_ylim(0, 1.15)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, never over them
    ax.set_title("held-out comparison")
    fig.tight_layout()
    fig.savefig(out / "comparison.png", dpi=110)
    plt.close(fig)
    (out / "comparison.md").write_text(f"# Comparison\n\n{table}\n\n![comparison](comparison.png)\n", encoding="utf-8")
    return table
