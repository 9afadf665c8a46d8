"""`sleuth compare`, `bfcl-table`, `summary` and `judge-check`: what finished runs showed."""

from __future__ import annotations

import argparse
from pathlib import Path

from sleuth.cli.args import command
from sleuth.cli.args import fail as _fail
from sleuth.core.args import bounded


def cmd_compare(args: argparse.Namespace) -> int:
    from sleuth.agents.eval.compare import compare, to_markdown, write_comparison_plot

    try:
        result = compare(args.run_a, args.run_b)
    except (FileNotFoundError, ValueError) as e:
        return _fail(str(e))
    text = to_markdown(result)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_comparison_plot(result, out / "compare.png")
        (out / "compare.md").write_text(f"# Comparison\n\n{text}\n\n![comparison](compare.png)\n")
        print(f"report: {out / 'compare.md'}")
    return 0


def cmd_judge_check(args: argparse.Namespace) -> int:
    from sleuth.agents.eval.judge_check import judge_check
    from sleuth.tasks import load_tasks
    from sleuth.verifiers.judge import JudgeConfigError

    if not (args.judge or args.group_judge):
        return _fail("give --judge FILE (a pointwise judge), --group-judge FILE (a group judge), or both")
    try:
        tasks = [t for t in load_tasks(args.tasks, limit=args.limit) if t.answer]
    except (FileNotFoundError, ValueError) as e:
        return _fail(str(e))
    if len(tasks) < 2:
        return _fail(f"{args.tasks} has {len(tasks)} task(s) with a gold answer: the check needs at least 2")
    try:
        result = judge_check(tasks, args.judge, args.group_judge, Path(args.out))
    except (JudgeConfigError, ValueError) as e:
        return _fail(str(e))
    print((Path(args.out) / "judge_check.md").read_text())
    print(f"report: {Path(args.out) / 'judge_check.md'} (data: judge_check.json, judge_check.png)")
    scored = result.get("pointwise", {}).get("scored", 0) + (result["group"]["calls"] - result["group"]["unreadable"]
                                                             if "group" in result else 0)
    if not scored:
        return _fail("the judge scored nothing: every call failed or gave a reply its settings cannot read "
                     "(see the report)")
    return 0


def cmd_bfcl_table(args: argparse.Namespace) -> int:
    from sleuth.agents.eval.bfcl_table import bfcl_report

    if len(args.runs) > 2:
        return _fail(f"bfcl-table takes one run or two (A B, paired), not {len(args.runs)}")
    for run in args.runs:
        if not (Path(run) / "trajectories.jsonl").is_file():
            return _fail(f"no eval run at {run} (no trajectories.jsonl)")
    try:
        print(bfcl_report(args.runs, args.out))
    except ValueError as e:
        return _fail(str(e))
    if args.out:
        print(f"report: {Path(args.out) / 'bfcl.md'}")
    return 0


def cmd_summary(args: argparse.Namespace) -> int:
    from sleuth.agents.eval.run_summary import summarize

    if not Path(args.run).is_dir():
        return _fail(f"no run directory at {args.run}: `make run` writes runs/main")
    print(summarize(args.run))
    print(f"summary: {Path(args.run) / 'summary.md'}")
    print(f"what the agents did, episode by episode: sleuth view {args.run} (or --html {Path(args.run) / 'view.html'})")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    c = command(sub, "compare", cmd_compare, "two eval runs side by side, with paired-bootstrap confidence intervals",
                example="sleuth compare runs/ev/smollm2-text runs/ev-trained/smollm2-text --out runs/compare")
    c.add_argument("run_a")
    c.add_argument("run_b")
    c.add_argument("--out", help="also write compare.md and compare.png here")
    b = command(sub, "bfcl-table", cmd_bfcl_table,
                "the BFCL leaderboard table of one eval run over bfcl: tasks, or of two paired (B − A)",
                example="sleuth bfcl-table runs/bfcl/smollm2 runs/bfcl/trained --out runs/bfcl/compare")
    b.add_argument("runs", nargs="+", metavar="RUN", help="one or two `sleuth eval` output directories")
    b.add_argument("--out", help="also write bfcl.md and bfcl.json here")
    sm = command(sub, "summary", cmd_summary, "what a `make run` directory showed: models, paired CIs, stage times, "
                        "reports (writes summary.md and summary.png there)",
                example="sleuth summary runs/main")
    sm.add_argument("run", nargs="?", default="runs/main")
    jc = command(sub, "judge-check", cmd_judge_check,
                 "how far an LLM judge agrees with a rule and how biased it is (position, length), on QA questions "
                 "with gold answers",
                 example="sleuth judge-check --judge judge.yaml --group-judge group.yaml --tasks hotpotqa:dev")
    jc.add_argument("--judge", metavar="FILE", help="a pointwise judge's settings (see docs/verifiers.md)")
    jc.add_argument("--group-judge", metavar="FILE", help="a group judge's settings")
    jc.add_argument("--tasks", default="hotpotqa:dev", help="QA tasks with gold answers (default hotpotqa:dev)")
    jc.add_argument("--limit", type=bounded(int, 2), default=40, help="questions (default 40)")
    jc.add_argument("--out", default="runs/judge_check", help="where judge_check.md / .json / .png go")
