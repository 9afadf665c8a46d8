"""`sleuth eval`: policies in envs, or a user's own agent through the gateway, on held-out tasks."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from sleuth.agents.eval.api import DEFAULT_ENV as DEFAULT_EVAL_ENV
from sleuth.agents.eval.api import DEFAULT_HARNESS
from sleuth.agents.loop.episodes import EPISODE_TIMEOUT_S
from sleuth.cli.args import command
from sleuth.cli.args import fail as _fail
from sleuth.core.args import bounded, output_dir
from sleuth.core.args import parse_kv as _kv


def cmd_eval(args: argparse.Namespace) -> int:
    """`sleuth eval`: the flags that only the command has checked here, then `sleuth.evaluate`, its result printed.
    What cannot run is a `BadInput` the command ends with (exit 2); failed episodes exit 75 (run it again)."""
    from sleuth.agents.eval.api import Agent, evaluate
    from sleuth.core.errors import InfraFailure

    refused = _flags_refused(args)
    if refused:
        return _fail(refused)
    timeout = EPISODE_TIMEOUT_S if args.episode_timeout is None else args.episode_timeout or None  # 0: no limit
    agent = Agent(args.agent, args.agent_command, args.agent_path or ".") if args.agent or args.agent_command \
        else None
    result = evaluate(args.tasks, args.policy, out=args.out, env=args.env, harness=args.harness,
                      env_args=_kv(args.env_arg), agent=agent, verifier=args.verifier, limit=args.limit,
                      dedupe=args.dedupe, samples=args.samples, max_tokens=args.max_tokens,
                      temperature=args.temperature, seed=args.seed, concurrency=args.concurrency,
                      env_threads=args.env_threads, resume=not args.no_resume,
                      episode_timeout_s=timeout,
                      load=_ray_loader(args) if args.cluster == "ray" else None)
    for table in result.bfcl_tables:
        print(table)
    if len(result.summaries) > 1:
        _print_table(result.summaries)
        print(f"\nreport: {result.report}")
    else:
        print(json.dumps(result.summaries[0], indent=2))
        print(f"report: {result.report}")
    if result.failures:  # the means above are over the episodes that ran; the failed ones are no answer
        raise InfraFailure(f"{'; '.join(result.failures)}; they are not scored: run the same command again to retry "
                           "them")
    return 0


def _flags_refused(args: argparse.Namespace) -> str | None:
    """Why flags of `sleuth eval` do not go together (None: they do): an agent (`--agent`, `--agent-command`) is its
    own harness, tools and prompt, so the env's flags do not apply to it."""
    if args.agent and args.agent_command:
        return "--agent and --agent-command: give one (a Python function, or a program in any language)"
    if not (args.agent or args.agent_command):
        return "--agent-path goes with --agent module:function or --agent-command CMD" \
            if args.agent_path is not None else None
    env_only = [f for f, v in (("--env", args.env is not None), ("--harness", args.harness is not None),
                               ("--env-arg", bool(args.env_arg)), ("--env-threads", args.env_threads > 0)) if v]
    if env_only:
        return (f"{', '.join(env_only)} cannot go with {'--agent' if args.agent else '--agent-command'}: the agent "
                "brings its own tools and prompt (its episodes run through the gateway, not an env)")
    return None


def _ray_loader(args: argparse.Namespace) -> Callable[[str], tuple[Any, Callable[[], None]]]:
    """`--cluster ray`: each model policy in `--rollout-workers` Ray actors (restarted when they die, their requests
    re-sent); scripted baselines run here."""
    def load(spec: str) -> tuple[Any, Callable[[], None]]:
        from sleuth.agents.policies.load import SCRIPTED_POLICIES, load_policy

        if spec in SCRIPTED_POLICIES:
            return load_policy(spec, seed=args.seed), lambda: None
        import torch

        from sleuth.agents.policies.models import resolve_model
        from sleuth.training.cluster.placement import ClusterConfig
        from sleuth.training.cluster.rollout_workers import WorkerPool

        cluster = ClusterConfig(backend="ray", address=args.ray_address, rollout_workers=args.rollout_workers,
                                worker_gpus=args.worker_gpus)
        pool = WorkerPool(cluster, str(resolve_model(spec)), torch.bfloat16 if args.worker_gpus else torch.float32,
                          max_batch=args.concurrency)
        return pool.policy, pool.close

    return load


def _print_table(summaries: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    from sleuth.agents.eval.report import columns

    cols = columns(summaries)
    table = Table(title="held-out evaluation")
    table.add_column("run")
    for c in cols:
        table.add_column(c, justify="right")
    for s in summaries:
        table.add_row(s["run"], *[f"{s[c]:.3f}" if isinstance(s.get(c), float) else str(s.get(c, "")) for c in cols])
    Console(width=160).print(table)


def register(sub: Any) -> None:
    """Register `eval` on the `sleuth` subparsers."""
    from sleuth.agents.policies.load import SCRIPTED_POLICIES
    from sleuth.agents.policies.models import EMBEDDED
    from sleuth.envs.parsers import PARSERS
    from sleuth.verifiers.registry import verifier_names

    e = command(sub, "eval", cmd_eval, "evaluate policies on held-out tasks",
                example="sleuth eval --env sleuth/DocRead-v0 --tasks hotpotqa:test --limit 20 --policy smollm2 "
                        "--out runs/ev")
    e.add_argument("--env", help=f"a registered env id (`sleuth envs` lists them; default {DEFAULT_EVAL_ENV}) or "
                   "FAMILY:ID of another library's env (e.g. gem:game:Sudoku-v0-easy, reasoning_gym:chain_sum)")
    e.add_argument("--agent", metavar="MODULE:FUNCTION",
                   help="evaluate your own agent instead of an env: run(task: dict, base_url: str) -> str, sync or "
                        "async, calling the policy through the OpenAI API at base_url; needs --verifier")
    e.add_argument("--agent-command", metavar="CMD",
                   help="evaluate an agent in any language instead: CMD (e.g. 'node agent.mjs') runs per episode in "
                        "--agent-path, the task's JSON on its stdin, OPENAI_BASE_URL in its environment, the answer "
                        "on its stdout; needs --verifier")
    e.add_argument("--agent-path", metavar="DIR",
                   help="the directory to import the agent's module from, or to run its command in (default: the "
                        "working directory)")
    e.add_argument("--verifier", help="with --agent or --agent-command: the verifier that scores its answers; with "
                   "an env: scores its episodes again once they are over (e.g. an LLM judge; a group judge compares "
                   f"the --samples of a task) ({verifier_names()})")
    e.add_argument("--tasks", help="NAME:SPLIT or NAME:PATH (e.g. hotpotqa:test); seeds:A-B for an env that makes "
                   "its own episodes (reasoning_gym:, gem:, textarena:, openenv:; default seeds:test, i.e. 0, 1, 2, "
                   "...); for verifiers: envs, the rows of its taskset (seeds:0-9; no default)")
    e.add_argument("--policy", default=EMBEDDED,
                   help=f"comma list of: {EMBEDDED}, a scripted baseline ({', '.join(SCRIPTED_POLICIES.names())}), "
                        "a local model directory or a hub id already in the local Hugging Face cache")
    e.add_argument("--harness", help=f"comma list of tool-call formats ({', '.join(PARSERS.names())}; default "
                   f"{DEFAULT_HARNESS}: Hermes/OpenAI JSON calls)")
    e.add_argument("--limit", type=bounded(int, 1), default=None, help="the first N tasks")
    e.add_argument("--out", type=output_dir, required=True, help="run directory (one sub-folder per policy × harness)")
    e.add_argument("--max-tokens", type=bounded(int, 1), default=64, help="tokens per turn")
    e.add_argument("--temperature", type=bounded(float, 0), default=0.0, help="0: greedy")
    e.add_argument("--concurrency", type=bounded(int, 1), default=8, help="episodes run (and batched) at once")
    e.add_argument("--seed", type=int, default=0, help="sampling and scripted-policy seed")
    e.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE", help="extra env kwargs")
    e.add_argument("--no-resume", action="store_true", help="start over instead of resuming trajectories.jsonl")
    e.add_argument("--episode-timeout", type=bounded(float, 0), default=None, metavar="SECONDS",
                   help="an episode still running this long after its reset fails as `timeout`, never scored, and is "
                        "retried by the same command (default: rollout.episode_timeout_s's, 1800; 0: no limit)")
    e.add_argument("--env-threads", type=bounded(int, 0), default=0,
                   help="threads stepping envs in parallel (use with Code-v0 sandboxes or Remote-v0 servers)")
    e.add_argument("--samples", type=bounded(int, 1), default=1,
                   help="episodes per task; pass@k is reported (needs --temperature > 0)")
    e.add_argument("--cluster", choices=("local", "ray"), default="local",
                   help="ray: run each model policy in --rollout-workers Ray actors (restarted when they die)")
    e.add_argument("--ray-address", default=None,
                   help="with --cluster ray: 'auto' or ray://host:port (left out: start a local Ray)")
    e.add_argument("--rollout-workers", type=bounded(int, 1), default=2, help="with --cluster ray: actors per policy")
    e.add_argument("--worker-gpus", type=bounded(float, 0), default=0.0, help="with --cluster ray: GPUs per worker")
    e.add_argument("--dedupe", action="store_true",
                   help="keep the first task of each repeated task id (default: refuse a task file with repeated ids)")
    e.set_defaults(on_interrupt="interrupted: what finished is kept; run the same command again to resume")
