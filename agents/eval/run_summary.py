"""`sleuth summary runs/main`: the one page that says what `make run` showed.

`make run` leaves a dozen reports (an eval folder per model, a comparison per pair, training plots); a reader
who opens only `summary.md` should learn how every model scored on the held-out questions, which differences
the paired bootstrap shows and which it does not, how long each stage took and where each report is. The
layout below is the Makefile's `run` target; a stage that has not run yet is listed as missing, not guessed.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from sleuth.agents.eval.compare import compare


@dataclass(frozen=True)
class Model:
    label: str
    folder: str  # the eval folder under the run directory


@dataclass(frozen=True)
class Pair:
    """A paired comparison that matters: does `b` differ from `a` on the questions both answered?"""
    label: str
    a: str
    b: str


TEST = (Model("oracle (reads the gold documents)", "oracle-text"), Model("lexical (rule, no model)", "lexical-text"),
        Model("first-k (rule)", "first-k-text"), Model("random (rule)", "random-text"),
        Model("SmolLM2, untrained", "smollm2-text"), Model("warm start (SFT)", "sft-text"),
        Model("RL (CIGPO from the warm start)", "trained-text"))
MUSIQUE = (Model("SmolLM2, untrained", "musique-untrained"), Model("RL (CIGPO from the warm start)", "musique-trained"))
PAIRS = (Pair("warm start vs untrained", "smollm2-text", "sft-text"),
         Pair("RL vs warm start", "sft-text", "trained-text"),
         Pair("RL vs untrained", "smollm2-text", "trained-text"),
         Pair("RL vs untrained, MuSiQue", "musique-untrained", "musique-trained"))
# What each pair is judged on: the answer, the reading, and the tool calls (their per-episode error share).
PAIRED_METRICS = {"f1": "answer F1", "support_recall": "support recall of reads", "tool_error_share": "invalid calls"}
COLUMNS = {"n": "n", "f1": "F1", "em": "EM", "support_recall": "support recall", "tool_error_rate_episodes":
           "invalid calls", "n_failed": "failed"}
REPORTS = ("comparison.md", "json/comparison.md", "warm-start/compare.md", "train/training.png",
           "rl-vs-warm-start/compare.md", "before-after/compare.md", "musique-before-after/compare.md")


def _summary(run: Path, model: Model) -> dict[str, Any] | None:
    path = run / model.folder / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _cpu() -> str:
    """The CPU model, its core count, and whether it has AMX-BF16 (which decides the recipe's dtype on a CPU)."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    name = names[0] if names else (platform.processor() or "unknown CPU")
    amx = any(line.startswith("flags") and "amx_bf16" in line.split() for line in lines)
    return f"{name}, {os.cpu_count()} cores, {'with' if amx else 'without'} AMX-BF16"


def _model_table(run: Path, models: tuple[Model, ...]) -> tuple[str, list[str]]:
    lines = ["| model | " + " | ".join(COLUMNS.values()) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    missing, shown = [], 0
    for model in models:
        s = _summary(run, model)
        if s is None:
            missing.append(model.folder)
            continue
        cells = [(f"{s[k]:.3f}" if isinstance(s.get(k), float) else str(s.get(k, "—"))) for k in COLUMNS]
        lines.append(f"| {model.label} | " + " | ".join(cells) + " |")
        shown += 1
    return ("\n".join(lines) if shown else "Not run yet."), missing


def _verdict(row: dict[str, Any]) -> str:
    if row["ci_low"] > 0:
        return "higher"
    if row["ci_high"] < 0:
        return "lower"
    return "no difference shown"


def paired(run: Path) -> list[dict[str, Any]]:
    """One row per (pair, metric) that both runs have: the means, B − A and its 95% paired-bootstrap CI."""
    rows = []
    for pair in PAIRS:
        if not ((run / pair.a / "trajectories.jsonl").is_file() and (run / pair.b / "trajectories.jsonl").is_file()):
            continue
        result = compare(run / pair.a, run / pair.b)
        for r in result["rows"]:
            if r["metric"] in PAIRED_METRICS:
                rows.append({"pair": pair.label, "name": PAIRED_METRICS[r["metric"]], **r, "verdict": _verdict(r)})
    return rows


def _stage_times(run: Path) -> list[dict[str, Any]]:
    """The last record of each stage (a resumed `make run` appends again; its last run is the one that counts)."""
    path = run / "stages.jsonl"
    last: dict[str, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                last[record["stage"]] = record
    return list(last.values())


def _findings(rows: list[dict[str, Any]]) -> list[str]:
    """Sentences a reader can take away: each difference the CI shows, and each it does not."""
    out = []
    for pair in PAIRS:
        mine = [r for r in rows if r["pair"] == pair.label]
        if not mine:
            continue
        said = [f"{r['name']} {r['verdict']} ({r['a']:.3f} → {r['b']:.3f}, {r['diff']:+.3f} "
                f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}])" for r in mine]
        out.append(f"- **{pair.label}**: " + "; ".join(said) + ".")
    return out


def summarize(run: str | Path) -> str:
    """Write `summary.md` and `summary.png` into the run directory and return the Markdown."""
    run = Path(run)
    test_table, test_missing = _model_table(run, TEST)
    musique_table, musique_missing = _model_table(run, MUSIQUE)
    rows = paired(run)
    stages = _stage_times(run)
    lines = [f"# What `make run` showed ({date.today().isoformat()}, {_cpu()})", "",
             "Greedy decoding; the same questions for every model; CIs are 95% paired bootstrap over questions "
             "(2,000 resamples). \"no difference shown\" means the interval spans 0.", "", "## Findings", "",
             *(_findings(rows) or ["- No paired comparison has run yet."]), "",
             "## Held-out HotpotQA test questions (DocRead, text harness)", "", test_table, "",
             "## MuSiQue questions (a data set never trained on)", "", musique_table, "",
             "## Paired differences", "", "| comparison | metric | n | A | B | B − A | 95% CI | |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['pair']} | {r['name']} | {r['n']} | {r['a']:.3f} | {r['b']:.3f} | {r['diff']:+.3f} | "
              f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] | {r['verdict']} |" for r in rows]
    lines += ["", "## Stage times", "", "| stage | minutes | exit status |", "|---|---|---|"]
    lines += [f"| {s['stage']} | {s['seconds'] / 60:.1f} | {s['rc']} |" for s in stages]
    lines.append(f"| **all stages** | **{sum(s['seconds'] for s in stages) / 60:.1f}** | |" if stages else
                 f"| no stage recorded in `{run / 'stages.jsonl'}` | | |")
    lines += ["", "Set-up (the venv and its packages) is not counted.", "", "## Reports", ""]
    lines += [f"- `{run / r}`" for r in REPORTS if (run / r).is_file()]
    lines += [f"- `{run / m}/report.md`" for m in (*[m.folder for m in TEST], *[m.folder for m in MUSIQUE])
              if (run / m / "report.md").is_file()]
    missing = test_missing + musique_missing
    if missing:
        lines += ["", "Not run yet: " + ", ".join(f"`{m}`" for m in missing) + "."]
    if rows:
        lines += ["", "![summary](summary.png)"]
        write_summary_plot(rows, run / "summary.png")
    text = "\n".join(lines) + "\n"
    (run / "summary.md").write_text(text)
    return text


def write_summary_plot(rows: list[dict[str, Any]], path: Path) -> None:
    """One panel per metric: each pair's difference B − A with its CI, a line at 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["name"] for r in rows))
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.4), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        mine = [r for r in rows if r["name"] == name]
        y = range(len(mine))
        ax.errorbar([r["diff"] for r in mine], list(y), capsize=4, fmt="o",
                    xerr=[[r["diff"] - r["ci_low"] for r in mine], [r["ci_high"] - r["diff"] for r in mine]])
        ax.axvline(0, color="grey", lw=0.8)
        ax.set_yticks(list(y), [r["pair"] for r in mine], fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"{name}: B − A, 95% CI", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
