"""The `sleuth` command."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any


def _kv(items: list[str]) -> dict[str, Any]:
    import yaml

    out = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"error: --env-arg wants KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        out[key] = yaml.safe_load(value)
    return out


def cmd_envs(args: argparse.Namespace) -> int:
    import sleuth

    for env_id, entry in sleuth.registered().items():
        print(f"{env_id:32s} {entry}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    import sleuth
    from sleuth.agents.evaluate import evaluate
    from sleuth.agents.policies import load_policy
    from sleuth.agents.policy import SamplingParams
    from sleuth.agents.report import write_comparison
    from sleuth.tasks import load_tasks

    env_args = _kv(args.env_arg)
    try:
        tasks = load_tasks(args.tasks, limit=args.limit)
    except (FileNotFoundError, ValueError) as e:
        return _fail(str(e))
    except Exception as e:  # e.g. a malformed JSONL line, reported by datasets
        return _fail(f"cannot load tasks {args.tasks!r}: {type(e).__name__}: {e}")
    if not tasks:
        return _fail(f"no tasks in {args.tasks!r}")
    try:
        sleuth.make(args.env, **env_args).close()  # fail fast on a bad env id or argument
    except Exception as e:
        return _fail(f"cannot build env {args.env!r}: {type(e).__name__}: {e}")
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    harnesses = [h.strip() for h in args.harness.split(",") if h.strip()]
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    out = Path(args.out)
    multi = len(policies) * len(harnesses) > 1
    summaries = []
    for spec in policies:
        try:
            policy = load_policy(spec, seed=args.seed)
        except Exception as e:  # a missing path, an unreachable hub id, a directory without weights
            return _fail(f"cannot load policy {spec!r}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        for harness in harnesses:
            run = f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', Path(spec).name)}-{harness}"
            try:
                summary = evaluate(
                    lambda h=harness: sleuth.make(args.env, harness=h, **env_args), tasks, policy,
                    out / run if multi else out, sampling, args.concurrency, args.env,
                    meta={"tasks": args.tasks, "harness": harness, "run": run}, resume=not args.no_resume,
                )
            except ValueError as e:  # e.g. a baseline that does not apply to this env
                return _fail(f"{run}: {e} (finished episodes are kept in {out})")
            summaries.append(summary)
    if multi:
        write_comparison(out, summaries)
        _print_table(summaries)
        print(f"\nreport: {out / 'comparison.md'}")
    else:
        print(json.dumps(summaries[0], indent=2))
        print(f"report: {out / 'report.md'}")
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    from sleuth.verifiers.batch import score_file

    if not Path(args.input).is_file():
        return _fail(f"input file not found: {args.input}")
    try:
        summary = score_file(args.verifier, args.input, args.out, args.workers)
    except ValueError as e:
        return _fail(str(e))
    print(json.dumps(summary, indent=2))
    return 0


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _print_table(summaries: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    from sleuth.agents.report import columns

    cols = columns(summaries)
    table = Table(title="held-out evaluation")
    table.add_column("run")
    for c in cols:
        table.add_column(c, justify="right")
    for s in summaries:
        table.add_row(s["run"], *[f"{s[c]:.3f}" if isinstance(s.get(c), float) else str(s.get(c, "")) for c in cols])
    Console(width=160).print(table)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sleuth", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("envs", help="list registered environments").set_defaults(fn=cmd_envs)
    e = sub.add_parser("eval", help="evaluate policies on held-out tasks")
    e.add_argument("--env", default="sleuth/DocRead-v0")
    e.add_argument("--tasks", required=True, help="NAME:SPLIT or NAME:PATH (e.g. hotpotqa:test)")
    e.add_argument("--policy", default="smollm2",
                   help="comma list of: smollm2, random, first-k, oracle, a local model path or a hub id")
    e.add_argument("--harness", default="json", help="comma list of tool-call formats: json, text")
    e.add_argument("--limit", type=int, default=None)
    e.add_argument("--out", required=True)
    e.add_argument("--max-tokens", type=int, default=64)
    e.add_argument("--temperature", type=float, default=0.0)
    e.add_argument("--concurrency", type=int, default=8, help="episodes run (and batched) at once")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE", help="extra env kwargs")
    e.add_argument("--no-resume", action="store_true", help="start over instead of resuming trajectories.jsonl")
    e.set_defaults(fn=cmd_eval)
    s = sub.add_parser("score", help="score JSONL records (data-set layout + a 'response' field) with a verifier")
    s.add_argument("--verifier", required=True, choices=["qa", "code"])
    s.add_argument("--input", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--workers", type=int, default=2, help="records scored in parallel (code: sandbox runs)")
    s.set_defaults(fn=cmd_score)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    raise SystemExit(main())
