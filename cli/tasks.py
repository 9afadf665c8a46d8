"""`sleuth envs` and `sleuth tasks build-swe`: what there is to run on."""

from __future__ import annotations

import argparse
import json

from sleuth.cli.args import command
from sleuth.cli.args import fail as _fail
from sleuth.core.args import bounded


def cmd_envs(args: argparse.Namespace) -> int:
    from sleuth.envs.registry import registrations

    for env_id, reg in registrations().items():
        print(f"{env_id:32s} {reg.target:44s} {reg.source}")
    return 0


def cmd_build_swe(args: argparse.Namespace) -> int:
    from sleuth.sandbox.repos import RepoError
    from sleuth.synth.swe import SWEBuilder

    try:
        builder = SWEBuilder(args.package, args.out, n=args.n, seed=args.seed, workers=args.workers,
                             max_tries=args.max_tries, test_deps=tuple(d for d in args.test_deps.split(",") if d))
        summary = builder.build()
    except (ValueError, RepoError, RuntimeError) as e:
        return _fail(str(e))
    print(json.dumps(summary, indent=2))
    return 0 if summary["tasks"] >= args.n else _fail(f"only {summary['tasks']} of {args.n} tasks found "
                                                       f"after {summary['tried']} mutants (raise --max-tries)")


def register(sub: argparse._SubParsersAction) -> None:
    command(sub, "envs", cmd_envs, "list registered environments", example="sleuth envs")
    tk = sub.add_parser("tasks", help="build task sets").add_subparsers(dest="tasks_command", required=True)
    bs = command(tk, "build-swe", cmd_build_swe, "synthesise SWE tasks from a PyPI package's sdist and its own tests",
                 example="sleuth tasks build-swe --package toolz==1.2.0 --n 30 --out toolz.jsonl")
    bs.add_argument("--package", required=True, metavar="NAME==VERSION")
    bs.add_argument("--n", type=bounded(int, 1), default=30, help="tasks wanted")
    bs.add_argument("--out", required=True, help="JSONL of task records (appended to; resumes)")
    bs.add_argument("--seed", type=int, default=0)
    bs.add_argument("--workers", type=bounded(int, 1), default=2, help="mutants tested at once (sandbox runs)")
    bs.add_argument("--max-tries", type=bounded(int, 1), help="mutants to try at most (default 8 x n)")
    bs.add_argument("--test-deps", default="", help="comma list of extra requirements its tests need")
