"""The BFCL leaderboard table of eval runs over `bfcl:` tasks: per-category accuracy and BFCL's summary columns, in
the public leaderboard's column order, with 95% bootstrap CIs; with two runs, their paired differences.

The summary columns are computed as bfcl-eval 2026.3.23 computes them (`eval_checker/eval_runner_helper.py`,
`generate_leaderboard_csv`): Non-Live Simple AST is the unweighted mean of simple python / java / javascript; the
Non-Live AST summary the unweighted mean of Simple, Multiple, Parallel and Parallel Multiple; the Live AST summary
the item-weighted mean of the four live AST categories; Multi Turn the unweighted mean of its four; Irrelevance the
unweighted mean of irrelevance and live_irrelevance; Overall the weighted mean 10 : 10 : 10 : 30 : 40 of Non-Live,
Live, Irrelevance, Multi Turn and Agentic. Agentic (web search, memory) does not run offline: as BFCL does for a
category it did not run, it counts 0 in Overall (so Overall is at most 60). `tests/test_bfcl_table.py` checks these
formulas against bfcl-eval's own functions. A category a run did not play counts 0 and shows "—".

Episodes that failed (an infrastructure failure, never scored) are left out of the accuracy and counted; an
episode cut at the policy's context limit scores 0, as BFCL scores an item whose inference could not finish."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sleuth.agents.eval.episodes import episodes, load_trajectories
from sleuth.agents.trajectory import Trajectory
from sleuth.tasks.bfcl import CATEGORIES, category_of

Scores = Mapping[str, Sequence[float]]  # category → item scores (1.0 / 0.0)
RESAMPLES = 2000


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _acc(scores: Scores, category: str) -> float:
    return _mean(scores.get(category, ()))


def _weighted(scores: Scores, categories: Sequence[str]) -> float:
    items = [s for c in categories for s in scores.get(c, ())]
    return _mean(items)


def _unweighted(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _non_live(s: Scores) -> float:
    simple = _unweighted([_acc(s, "simple_python"), _acc(s, "simple_java"), _acc(s, "simple_javascript")])
    return _unweighted([simple, _acc(s, "multiple"), _acc(s, "parallel"), _acc(s, "parallel_multiple")])


def _live(s: Scores) -> float:
    return _weighted(s, ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple"))


def _multi_turn(s: Scores) -> float:
    return _unweighted([_acc(s, c) for c in ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param",
                                             "multi_turn_long_context")])


def _irrelevance(s: Scores) -> float:
    return _unweighted([_acc(s, "irrelevance"), _acc(s, "live_irrelevance")])


def _overall(s: Scores) -> float:
    agentic = 0.0  # web search and memory do not run offline
    return (10 * _non_live(s) + 10 * _live(s) + 10 * _irrelevance(s) + 30 * _multi_turn(s) + 40 * agentic) / 100


def _simple_ast(s: Scores) -> float:
    return _unweighted([_acc(s, "simple_python"), _acc(s, "simple_java"), _acc(s, "simple_javascript")])


# (column, formula, the categories it reads) in the leaderboard's order: overall, non-live, live, multi-turn
COLUMNS: list[tuple[str, Callable[[Scores], float], tuple[str, ...]]] = [
    ("Overall Acc", _overall, CATEGORIES),
    ("Non-Live AST", _non_live, ("simple_python", "simple_java", "simple_javascript", "multiple", "parallel",
                                 "parallel_multiple")),
    ("Non-Live Simple AST", _simple_ast, ("simple_python", "simple_java", "simple_javascript")),
    *[(c, (lambda s, c=c: _acc(s, c)), (c,)) for c in ("simple_python", "simple_java", "simple_javascript")],
    *[(c, (lambda s, c=c: _acc(s, c)), (c,)) for c in ("multiple", "parallel", "parallel_multiple")],
    ("Live AST", _live, ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")),
    *[(c, (lambda s, c=c: _acc(s, c)), (c,)) for c in ("live_simple", "live_multiple", "live_parallel",
                                                        "live_parallel_multiple")],
    ("Multi Turn", _multi_turn, ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param",
                                 "multi_turn_long_context")),
    *[(c, (lambda s, c=c: _acc(s, c)), (c,)) for c in ("multi_turn_base", "multi_turn_miss_func",
                                                        "multi_turn_miss_param", "multi_turn_long_context")],
    ("Irrelevance Detection", _irrelevance, ("irrelevance", "live_irrelevance")),
    *[(c, (lambda s, c=c: _acc(s, c)), (c,)) for c in ("irrelevance", "live_irrelevance", "live_relevance")],
]


def item_score(t: Trajectory) -> float | None:
    """1.0 / 0.0 as BFCL scores the item; None for an infrastructure failure (never scored). An episode the loop
    ended at the policy's context limit has no verdict: BFCL scores an item whose inference could not finish (the
    endpoint refused the request) as failed, and so does this table."""
    if t.failed:
        return None
    return float(t.verdict is not None and t.verdict.score >= 1.0)


def run_scores(trajs: Sequence[Trajectory]) -> tuple[dict[str, dict[str, float]], dict[str, int]]:
    """category → {item id: score} over the scored episodes (the first sample of each task), and the failed
    episodes per category."""
    scores: dict[str, dict[str, float]] = {}
    failed: dict[str, int] = {}
    for group in episodes(trajs):
        t = group[0]
        category, score = category_of(t.task_id), item_score(t)
        if score is None:
            failed[category] = failed.get(category, 0) + 1
            continue
        scores.setdefault(category, {})[t.task_id] = score
    return scores, failed


def _resample(scores: Mapping[str, Mapping[str, float]], rng: random.Random) -> dict[str, list[str]]:
    """Item ids drawn with replacement within each category (a stratified bootstrap)."""
    return {c: rng.choices(list(items), k=len(items)) for c, items in scores.items() if items}


def table(scores: Mapping[str, Mapping[str, float]], resamples: int = RESAMPLES, seed: int = 0
          ) -> list[dict[str, Any]]:
    """Each column's accuracy and 95% CI (percentiles of a stratified bootstrap over items)."""
    rng = random.Random(seed)
    flat = {c: list(items.values()) for c, items in scores.items()}
    draws = []
    for _ in range(resamples):
        ids = _resample(scores, rng)
        draws.append({c: [scores[c][i] for i in chosen] for c, chosen in ids.items()})
    rows = []
    for name, formula, reads in COLUMNS:
        values = sorted(formula(d) for d in draws)
        played = any(c in flat for c in reads)
        rows.append({"column": name, "accuracy": formula(flat) if played else None,
                     "n": sum(len(flat.get(c, ())) for c in reads),
                     "ci": [values[int(0.025 * resamples)], values[int(0.975 * resamples) - 1]] if played else None})
    return rows


def paired(a: Mapping[str, Mapping[str, float]], b: Mapping[str, Mapping[str, float]], resamples: int = RESAMPLES,
           seed: int = 0) -> list[dict[str, Any]]:
    """B − A per column over the items both runs scored, with a paired stratified bootstrap CI."""
    common = {c: sorted(set(a.get(c, {})) & set(b.get(c, {}))) for c in set(a) | set(b)}
    common = {c: ids for c, ids in common.items() if ids}
    rng = random.Random(seed)
    draws = []
    for _ in range(resamples):
        chosen = {c: rng.choices(ids, k=len(ids)) for c, ids in common.items()}
        draws.append(({c: [a[c][i] for i in ids] for c, ids in chosen.items()},
                      {c: [b[c][i] for i in ids] for c, ids in chosen.items()}))
    full_a = {c: [a[c][i] for i in ids] for c, ids in common.items()}
    full_b = {c: [b[c][i] for i in ids] for c, ids in common.items()}
    rows = []
    for name, formula, reads in COLUMNS:
        if not any(c in common for c in reads):
            rows.append({"column": name, "diff": None, "ci": None, "n": 0})
            continue
        diffs = sorted(formula(db) - formula(da) for da, db in draws)
        rows.append({"column": name, "diff": formula(full_b) - formula(full_a),
                     "n": sum(len(common.get(c, ())) for c in reads),
                     "b_better": sum(full_b[c][k] > full_a[c][k] for c in reads if c in common
                                     for k in range(len(common[c]))),
                     "b_worse": sum(full_b[c][k] < full_a[c][k] for c in reads if c in common
                                    for k in range(len(common[c]))),
                     "ci": [diffs[int(0.025 * resamples)], diffs[int(0.975 * resamples) - 1]]})
    return rows


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.2f}"


def to_markdown(runs: Sequence[tuple[str, list[dict[str, Any]], dict[str, int]]],
                diff: list[dict[str, Any]] | None = None) -> str:
    names = [name for name, _, _ in runs]
    lines = ["| column | " + " | ".join(f"{n} (%) [95% CI]" for n in names) + (" | B − A (pp) [95% CI] | B better / "
                                                                                "worse |" if diff else ""),
             "|---|" + "---|" * len(names) + ("---|---|" if diff else "")]
    for k, (column, _, _) in enumerate(COLUMNS):
        cells = []
        for _, rows, _ in runs:
            r = rows[k]
            cells.append(_pct(r["accuracy"]) + (f" [{_pct(r['ci'][0])}, {_pct(r['ci'][1])}]" if r["ci"] else "")
                         + (f" (n={r['n']})" if r["accuracy"] is not None else ""))
        if diff:
            d = diff[k]
            cells.append("—" if d["diff"] is None else
                         f"{100 * d['diff']:+.2f} [{100 * d['ci'][0]:+.2f}, {100 * d['ci'][1]:+.2f}]")
            cells.append("—" if d["diff"] is None else f"{d['b_better']} / {d['b_worse']}")
        lines.append(f"| {column} | " + " | ".join(cells) + " |")
    failed = [f"{name}: {sum(f.values())} ({', '.join(f'{c} {n}' for c, n in sorted(f.items()))})"
              for name, _, f in runs if f]
    lines.append("")
    lines.append("Episodes failed (infrastructure; not scored): " + ("; ".join(failed) if failed else "none") + ".")
    lines.append("Overall uses BFCL's weights 10:10:10:30:40 (Non-Live, Live, Irrelevance, Multi Turn, Agentic); "
                 "Agentic does not run offline and counts 0, as BFCL counts a category it did not run.")
    return "\n".join(lines) + "\n"


def bfcl_report(run_dirs: Sequence[str | Path], out: str | Path | None = None) -> str:
    """The table of one run, or of two with their paired differences (B = the second); written to
    `out/bfcl.md` and `out/bfcl.json` when `out` is given. Returns the Markdown."""
    runs, raw = [], []
    for d in run_dirs:
        scores, failed = run_scores(load_trajectories(Path(d) / "trajectories.jsonl"))
        if not scores and not failed:
            raise ValueError(f"{d} holds no BFCL episodes (run `sleuth eval --env bfcl:... --tasks bfcl:...`)")
        raw.append(scores)
        runs.append((Path(d).name, table(scores), failed))
    diff = paired(raw[0], raw[1]) if len(raw) == 2 else None
    md = to_markdown(runs, diff)
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bfcl.md").write_text(md, encoding="utf-8")
        written = [{"run": str(d), "columns": rows, "failed": failed}
                   for d, (_, rows, failed) in zip(run_dirs, runs, strict=True)]
        (out / "bfcl.json").write_text(json.dumps({"runs": written, "paired": diff}, indent=2) + "\n",
                                       encoding="utf-8")
    return md
