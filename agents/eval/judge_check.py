"""How far a judge can be trusted, measured where a rule exists: QA questions with gold answers (HotpotQA's dev
split by default). Each question gets candidate answers whose correctness the rule knows — the gold answer, a wrong
one (another question's answer), a part of the gold, and the gold or the wrong answer padded with words that add
nothing — and the judge scores them. Reported, each with a 95% bootstrap interval over questions:

- agreement with the rule: accuracy and Cohen's kappa of "judge ≥ 0.5" against exact match, the AUC of the judge's
  score between right and wrong candidates, Spearman's rank correlation with token F1;
- length bias: the judge's score of a padded candidate minus the same candidate unpadded (0 for an unbiased judge);
- a group judge's position bias: the gold and the wrong answer shown as a pair in both orders, the share of
  orders in which the member shown first scored higher (0.5 for a judge that looks at content), how often the
  judge prefers the same member in both orders, and how often that member is the gold one;
- a group judge's length preference: the gold answer beside its padded copy, how much more often the longer wins;
- replies the judge's settings could not read (every such call is a failure, never a score), tokens and seconds
  per call, and so per episode.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from sleuth.agents.eval.compare import bootstrap_ci
from sleuth.tasks.base import Task
from sleuth.verifiers.base import Verdict
from sleuth.verifiers.judge import GroupJudge, JudgeStats, PointwiseJudge
from sleuth.verifiers.judge.prompts import ranks
from sleuth.verifiers.qa import exact_match, token_f1
from sleuth.verifiers.registry import JUDGE_PREFIX, get_verifier, group_verifier

PADDING = "After weighing all of the evidence in the documents with great care, the answer to this question is {}, " \
          "as the passages make clear when they are read together."
KINDS = ("gold", "wrong", "partial", "padded_gold", "padded_wrong")


@dataclass(frozen=True)
class Candidate:
    task: Task
    kind: str
    text: str

    @property
    def em(self) -> float:
        return max(exact_match(self.text, a) for a in [self.task.answer, *self.task.aliases])

    @property
    def f1(self) -> float:
        return max(token_f1(self.text, a) for a in [self.task.answer, *self.task.aliases])


def candidates(tasks: Sequence[Task], seed: int = 0) -> list[list[Candidate]]:
    """Per task: its gold answer, a wrong one (a yes/no question gets the other word; others another task's answer
    that shares no token with the gold), the first half of a gold answer of several words, and both padded."""
    rng = random.Random(seed)
    out = []
    for task in tasks:
        gold = task.answer
        if gold.lower() in ("yes", "no"):
            wrong = "no" if gold.lower() == "yes" else "yes"
        else:
            pool = [t.answer for t in tasks if t.answer.lower() not in ("yes", "no") and token_f1(t.answer, gold) == 0]
            wrong = rng.choice(pool) if pool else "unknown"
        row = [Candidate(task, "gold", gold), Candidate(task, "wrong", wrong)]
        words = gold.split()
        if len(words) >= 2:
            row.append(Candidate(task, "partial", " ".join(words[:len(words) // 2])))
        row += [Candidate(task, "padded_gold", PADDING.format(gold)), Candidate(task, "padded_wrong",
                                                                               PADDING.format(wrong))]
        out.append(row)
    return out


def _mean_ci(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"mean": None, "ci": None, "n": 0}
    low, high = bootstrap_ci(values)
    return {"mean": sum(values) / len(values), "ci": [low, high], "n": len(values)}


def _auc(pos: list[float], neg: list[float]) -> float | None:
    if not pos or not neg:
        return None
    return sum((a > b) + 0.5 * (a == b) for a in pos for b in neg) / (len(pos) * len(neg))


def _spearman(x: list[float], y: list[float]) -> float | None:
    """Pearson's correlation of the ranks (tied values share their mean rank)."""
    if len(x) < 3:
        return None
    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    sy = math.sqrt(sum((b - my) ** 2 for b in ry))
    if sx == 0 or sy == 0:
        return None  # a judge that gives every candidate one score ranks nothing
    return sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True)) / (sx * sy)


def _per_question_ci(rows: list[list[float]], stat: Callable[[list[list[float]]], float | None]) -> list[float] | None:
    """A 95% interval of `stat` over `rows` (one per question) resampled with replacement."""
    if len(rows) < 2 or stat(rows) is None:
        return None
    rng = random.Random(0)
    vals = sorted(v for v in (stat([rows[rng.randrange(len(rows))] for _ in rows]) for _ in range(1000))
                  if v is not None)
    return [vals[int(0.025 * len(vals))], vals[int(0.975 * len(vals)) - 1]] if vals else None


def check_pointwise(judge: PointwiseJudge, rows: list[list[Candidate]], progress: bool = True) -> dict[str, Any]:
    flat = [c for row in rows for c in row]
    bar = tqdm(total=len(flat), desc="judge pointwise", disable=not progress)

    def one(c: Candidate) -> Verdict:
        try:
            return judge(c.task, c.text)
        finally:
            bar.update(1)

    got = judge.client.map(one, flat)
    bar.close()
    scores = {id(c): v.score for c, v in zip(flat, got, strict=True) if isinstance(v, Verdict)}
    per_q = [[(c, scores.get(id(c))) for c in row] for row in rows]
    rule = [[(c.em, c.f1, s) for c, s in q if c.kind in ("gold", "wrong", "partial") and s is not None] for q in per_q]

    def accuracy(qs: list[list[Any]]) -> float | None:
        pairs = [((s >= 0.5) == (em == 1.0)) for q in qs for em, _, s in q]
        return sum(pairs) / len(pairs) if pairs else None

    def kappa(qs: list[list[Any]]) -> float | None:
        pairs = [(s >= 0.5, em == 1.0) for q in qs for em, _, s in q]
        if not pairs:
            return None
        po = sum(a == b for a, b in pairs) / len(pairs)
        pa, pb = sum(a for a, _ in pairs) / len(pairs), sum(b for _, b in pairs) / len(pairs)
        pe = pa * pb + (1 - pa) * (1 - pb)
        return None if pe == 1 else (po - pe) / (1 - pe)

    def auc(qs: list[list[Any]]) -> float | None:
        return _auc([s for q in qs for em, _, s in q if em == 1.0], [s for q in qs for em, _, s in q if em == 0.0])

    def spearman(qs: list[list[Any]]) -> float | None:
        return _spearman([s for q in qs for _, _, s in q], [f1 for q in qs for _, f1, _ in q])

    def shift(padded: str, plain: str) -> list[float]:
        out = []
        for q in per_q:
            by = {c.kind: s for c, s in q}
            if by.get(padded) is not None and by.get(plain) is not None:
                out.append(by[padded] - by[plain])
        return out

    by_kind = {k: [s for q in per_q for c, s in q if c.kind == k and s is not None] for k in KINDS}
    return {
        "candidates": len(flat), "scored": len(scores), "unreadable": len(flat) - len(scores),
        "unreadable_examples": _examples(got),
        "mean_score": {k: _mean_ci(v) for k, v in by_kind.items()},
        "agreement": {name: {"value": fn(rule), "ci": _per_question_ci(rule, fn)}
                      for name, fn in (("accuracy_vs_em", accuracy), ("kappa_vs_em", kappa), ("auc_vs_em", auc),
                                       ("spearman_vs_f1", spearman))},
        "length_bias": {"padded_gold_minus_gold": _mean_ci(shift("padded_gold", "gold")),
                        "padded_wrong_minus_wrong": _mean_ci(shift("padded_wrong", "wrong"))},
    }


def check_group(judge: GroupJudge, rows: list[list[Candidate]], progress: bool = True) -> dict[str, Any]:
    """Pairs shown in both orders (the judge's own shuffle off, so the order is the one asked)."""
    fixed = GroupJudge(replace(judge.cfg, shuffle=False), judge.rules)
    pairs = []
    for row in rows:
        by = {c.kind: c for c in row}
        pairs += [("order", by["gold"], by["wrong"]), ("order", by["wrong"], by["gold"]),
                  ("length", by["gold"], by["padded_gold"]), ("length", by["padded_gold"], by["gold"])]
    bar = tqdm(total=len(pairs), desc="judge group", disable=not progress)

    def one(p: tuple[str, Candidate, Candidate]) -> list[float]:
        try:
            return [v.details["judge"]["score"] for v in fixed.score_group(p[1].task, [p[1].text, p[2].text],
                                                                             [{}, {}])]
        finally:
            bar.update(1)

    got = fixed.client.map(one, pairs)
    bar.close()
    first_wins, same_pick, gold_pick, longer, ties = [], [], [], [], 0
    for q in range(len(rows)):
        o1, o2, l1, l2 = got[4 * q:4 * q + 4]
        if isinstance(o1, list) and isinstance(o2, list):
            for s in (o1, o2):
                ties += s[0] == s[1]
                first_wins.append(float(s[0] > s[1]))
            pick1 = "gold" if o1[0] > o1[1] else "wrong" if o1[1] > o1[0] else "tie"
            pick2 = "gold" if o2[1] > o2[0] else "wrong" if o2[0] > o2[1] else "tie"
            same_pick.append(float(pick1 == pick2 and pick1 != "tie"))
            gold_pick.append((float(pick1 == "gold") + float(pick2 == "gold")) / 2)
        if isinstance(l1, list) and isinstance(l2, list):  # +1: the padded copy won, −1: the plain one did
            longer.append(((l1[1] > l1[0]) - (l1[1] < l1[0]) + (l2[0] > l2[1]) - (l2[0] < l2[1])) / 2)
    return {"calls": len(pairs), "unreadable": sum(not isinstance(g, list) for g in got),
            "unreadable_examples": _examples(got), "ties": ties,
            "first_shown_wins": _mean_ci(first_wins), "same_pick_both_orders": _mean_ci(same_pick),
            "gold_preferred": _mean_ci(gold_pick), "padded_preferred": _mean_ci(longer),
            "cost": _cost(fixed.take_stats())}


def _examples(got: list[Any], n: int = 3) -> list[str]:
    """What the first few failures said (the judge's reply, for a reply its settings cannot read)."""
    return [str(e)[:400] for e in got if isinstance(e, Exception)][:n]


def _cost(stats: JudgeStats) -> dict[str, float]:
    calls = max(1, stats.calls)
    return {"calls": stats.calls, "prompt_tokens_per_call": stats.prompt_tokens / calls,
            "completion_tokens_per_call": stats.completion_tokens / calls, "seconds_per_call": stats.latency_s / calls,
            "junk": stats.junk, "errors": stats.errors}


def judge_check(tasks: Sequence[Task], pointwise: str | None, group: str | None, out: Path,
                progress: bool = True) -> dict[str, Any]:
    """Run the checks for the judge files given and write `judge_check.json`, `judge_check.md`, `judge_check.png`."""
    rows = candidates(tasks)
    result: dict[str, Any] = {"questions": len(tasks), "tasks": sorted({t.source or "" for t in tasks})}
    if pointwise:
        judge = group_verifier(JUDGE_PREFIX + pointwise) or get_verifier(JUDGE_PREFIX + pointwise)
        if not isinstance(judge, PointwiseJudge):
            raise ValueError(f"{pointwise} is a group judge: pass it as the group judge")
        result["pointwise"] = {"judge": pointwise, "model": judge.cfg.model, **check_pointwise(judge, rows, progress),
                               "cost": _cost(judge.take_stats())}
    if group:
        gj = group_verifier(JUDGE_PREFIX + group)
        if not isinstance(gj, GroupJudge):
            raise ValueError(f"{group} is a pointwise judge: pass it as the pointwise judge")
        result["group"] = {"judge": group, "model": gj.cfg.model, **check_group(gj, rows, progress)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "judge_check.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "judge_check.md").write_text(report(result))
    plot(result, out / "judge_check.png")
    return result


def _fmt(x: dict[str, Any] | None) -> str:
    if not x or x.get("mean") is None:
        return "—"
    ci = x.get("ci")
    return f"{x['mean']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] (n={x['n']})" if ci else f"{x['mean']:.3f} (n={x['n']})"


def report(r: dict[str, Any]) -> str:
    lines = [f"# Judge check: {r['questions']} questions", ""]
    if "pointwise" in r:
        p = r["pointwise"]
        lines += [f"## Pointwise: {p['judge']} ({p['model']})", "",
                  f"{p['scored']} of {p['candidates']} candidates scored; {p['unreadable']} replies unreadable "
                  "(failures, never scores).", *_example_lines(p), "", "| candidate | mean judge score [95% CI] |",
                  "|---|---|"]
        lines += [f"| {k} | {_fmt(v)} |" for k, v in p["mean_score"].items()]
        lines += ["", "| agreement with the rule | value [95% CI] |", "|---|---|"]
        for k, v in p["agreement"].items():
            val = "—" if v["value"] is None else f"{v['value']:.3f}"
            ci = f" [{v['ci'][0]:.3f}, {v['ci'][1]:.3f}]" if v["ci"] else ""
            lines.append(f"| {k} | {val}{ci} |")
        lines += ["", "| length bias (padded − plain) | mean [95% CI] |", "|---|---|"]
        lines += [f"| {k} | {_fmt(v)} |" for k, v in p["length_bias"].items()]
        lines += ["", f"Cost: {_cost_line(p['cost'])}", ""]
    if "group" in r:
        g = r["group"]
        lines += [f"## Group: {g['judge']} ({g['model']})", "",
                  f"{g['calls']} pair calls, {g['unreadable']} unreadable, {g['ties']} ties.", *_example_lines(g), "",
                  "| measure | mean [95% CI] | unbiased |", "|---|---|---|",
                  f"| first shown wins | {_fmt(g['first_shown_wins'])} | 0.5 |",
                  f"| same pick in both orders | {_fmt(g['same_pick_both_orders'])} | 1 |",
                  f"| gold preferred over wrong | {_fmt(g['gold_preferred'])} | 1 |",
                  f"| padded preferred over plain gold (−1..1) | {_fmt(g['padded_preferred'])} | 0 |",
                  "", f"Cost: {_cost_line(g['cost'])}", ""]
    return "\n".join(lines)


def _example_lines(part: dict[str, Any]) -> list[str]:
    return ["", "Unreadable, for example:", *[f"- `{e}`" for e in part["unreadable_examples"]]] \
        if part["unreadable_examples"] else []


def _cost_line(c: dict[str, float]) -> str:
    return (f"{c['calls']} calls, {c['prompt_tokens_per_call']:.0f} prompt + {c['completion_tokens_per_call']:.0f} "
            f"completion tokens and {c['seconds_per_call']:.2f} s per call; {c['junk']} junk replies, "
            f"{c['errors']} failed requests")


def plot(r: dict[str, Any], path: Path) -> None:
    from sleuth.agents.eval.report import _plt

    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.2))
    if "pointwise" in r:
        kinds = [k for k, v in r["pointwise"]["mean_score"].items() if v["mean"] is not None]
        means = [r["pointwise"]["mean_score"][k]["mean"] for k in kinds]
        err = [[m - r["pointwise"]["mean_score"][k]["ci"][0] for k, m in zip(kinds, means, strict=True)],
               [r["pointwise"]["mean_score"][k]["ci"][1] - m for k, m in zip(kinds, means, strict=True)]]
        ax.bar(kinds, means, yerr=err, color="#4c72b0", capsize=3)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("mean judge score")
        ax.set_title(f"pointwise judge ({r['pointwise']['model']}) by candidate, 95% CI")
    else:
        ax.text(0.5, 0.5, "no pointwise judge checked", ha="center")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
