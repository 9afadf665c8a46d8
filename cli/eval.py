"""`sleuth eval`: policies in envs, or a user's own agent through the gateway, on held-out tasks."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sleuth.cli.args import bounded, one_line, output_dir
from sleuth.cli.args import fail as _fail
from sleuth.cli.args import parse_kv as _kv
from sleuth.core.rundir import RunDirBusyError, RunDirLock

DEFAULT_EVAL_ENV, DEFAULT_HARNESS = "sleuth/DocRead-v0", "json"


def cmd_eval(args: argparse.Namespace) -> int:
    import sleuth
    from sleuth.tasks import load_tasks

    refused = _eval_mode(args)
    if refused:
        return _fail(refused)
    env_args = _kv(args.env_arg)
    if args.samples > 1 and args.temperature == 0:
        return _fail(f"--samples {args.samples} at --temperature 0 would be {args.samples} copies of one greedy "
                     "episode (pass@k of identical samples): sample with --temperature > 0, e.g. 0.7")
    agent = None
    if args.agent or args.agent_command:  # before the tasks and the model load: a missing agent is one line at once
        from sleuth.agents.gateway.agent_runner import AgentLoadError, CommandAgent, load_agent

        try:
            agent = (load_agent(args.agent, args.agent_path or ".") if args.agent
                     else CommandAgent(args.agent_command, args.agent_path or "."))
        except AgentLoadError as e:
            return _fail(str(e))
    try:
        tasks = load_tasks(args.tasks, limit=args.limit, dedupe=args.dedupe)
    except (FileNotFoundError, ValueError) as e:
        return _fail(str(e))
    except Exception as e:  # e.g. a malformed JSONL line, reported by datasets
        return _fail(f"cannot load tasks {args.tasks!r}: {type(e).__name__}: {e}")
    if not tasks:
        return _fail(f"no tasks in {args.tasks!r}")
    try:
        if agent is None:
            sleuth.make(args.env, **env_args).close()  # fail fast on a bad env id or argument
    except Exception as e:
        return _fail(f"cannot build env {args.env!r}: {type(e).__name__}: {e}")
    try:
        return _eval_runs(args, tasks, env_args, Path(args.out), agent)
    except RunDirBusyError as e:
        return _fail(str(e))
    except OSError as e:  # the run directory cannot be made (a read-only or virtual file system)
        return _fail(f"cannot write the run to {args.out}: {e.strerror or e}")


def _eval_mode(args: argparse.Namespace) -> str | None:
    """Why the options of `sleuth eval` do not go together (None: they do), the env defaults filled in. An
    agent (`--agent`, `--agent-command`) is its own harness, tools and prompt: env options do not apply to it,
    and its answers are scored by the verifier it names."""
    from sleuth.agents.policies.load import SCRIPTED_POLICIES
    from sleuth.verifiers.base import CannotScore
    from sleuth.verifiers.registry import get_verifier, group_verifier, verifier_names

    if args.agent and args.agent_command:
        return "--agent and --agent-command: give one (a Python function, or a program in any language)"
    if not (args.agent or args.agent_command):
        if args.agent_path is not None:
            return "--agent-path goes with --agent module:function or --agent-command CMD"
        if args.verifier is not None:  # the env's episodes scored again, e.g. by a judge
            try:
                group = group_verifier(args.verifier)
                if group is None:
                    get_verifier(args.verifier)
            except (LookupError, ValueError, CannotScore) as e:
                return str(e)
            if group is not None and args.samples < 2:
                return (f"{args.verifier} is a group judge: it compares the samples of a task, so it needs "
                        f"--samples K (K ≥ 2, with --temperature > 0)")
        from sleuth.envs.families import family_of

        args.env = args.env or DEFAULT_EVAL_ENV
        family = family_of(args.env)
        args.harness = args.harness or (family.harness if family else DEFAULT_HARNESS)
        if args.tasks is None:
            if not (family and family.seeded):
                return f"--tasks is required for {args.env} (e.g. hotpotqa:test, or a Task JSONL)"
            if family.rows:
                return f"--tasks is required for {args.env}: the rows of its task set it plays (e.g. seeds:0-9)"
            args.tasks = "seeds:test"  # an env that makes its own episodes: seeds 0, 1, 2, ... (--limit N)
        return None
    env_only = [f for f, v in (("--env", args.env is not None), ("--harness", args.harness is not None),
                               ("--env-arg", bool(args.env_arg)), ("--env-threads", args.env_threads > 0)) if v]
    flag = "--agent" if args.agent else "--agent-command"
    if env_only:
        return (f"{', '.join(env_only)} cannot go with {flag}: the agent brings its own tools and prompt "
                "(its episodes run through the gateway, not an env)")
    if args.tasks is None:
        return f"{flag} needs --tasks (e.g. hotpotqa:test)"
    if args.verifier is None:
        return f"{flag} needs --verifier NAME to score its answers (one of {verifier_names()})"
    try:
        get_verifier(args.verifier)
    except (LookupError, ValueError, CannotScore) as e:  # an unknown name, a bad judge file, a group judge
        return str(e)
    scripted = [p for p in args.policy.split(",") if p.strip() in SCRIPTED_POLICIES]
    if scripted:
        return (f"--policy {scripted[0].strip()} is a scripted baseline of sleuth's envs; an agent needs a model "
                "behind the gateway (smollm2, a model directory or a hub id)")
    return None


def _eval_runs(args: argparse.Namespace, tasks: list, env_args: dict[str, Any], out: Path, agent: Any = None) -> int:
    """Each policy × harness of `sleuth eval` into `out` (its own sub-folder when there are several), or each
    policy behind `agent`. `out` is owned by this process from the moment the first policy has loaded: a
    refused policy writes nothing."""
    import sleuth
    from sleuth.agents.eval.episodes import evaluate, evaluate_agent, load_trajectories, policy_identity
    from sleuth.agents.eval.report import write_comparison
    from sleuth.agents.eval.rescore import Rescorer
    from sleuth.agents.gateway.agent_runner import agent_identity
    from sleuth.agents.loop.episodes import EPISODE_TIMEOUT_S
    from sleuth.agents.policies.base import SamplingParams

    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    harnesses = [h.strip() for h in args.harness.split(",") if h.strip()] if agent is None else [""]
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    multi = len(policies) * len(harnesses) > 1
    names = _run_names(policies)
    summaries: list[dict[str, Any]] = []
    failures: list[str] = []
    lock = RunDirLock(out)
    owned = False
    stack = contextlib.ExitStack()  # what the loaded policies hold (Ray workers), released at the end
    try:
        for spec in policies:
            try:
                policy, release = _load_policy(spec, args)
            except Exception as e:  # a missing path, an unreachable hub id, a directory without weights
                return _fail(f"cannot load policy {spec!r}: {type(e).__name__}: {one_line(str(e))}")
            if not owned:
                lock.acquire()
                owned = True
            stack.callback(release)
            for harness in harnesses:
                run = f"{names[spec]}-{harness}" if harness else names[spec]
                identity = {"policy": policy_identity(spec), "tasks": args.tasks, "limit": args.limit,
                            "samples": args.samples, "sampling": {"max_tokens": args.max_tokens,
                                                                  "temperature": args.temperature, "seed": args.seed}}
                try:
                    if agent is not None:
                        summary = evaluate_agent(
                            agent, tasks, policy, out / run if multi else out, args.verifier, sampling,
                            args.concurrency, args.agent or args.agent_command, meta={"tasks": args.tasks, "run": run},
                            resume=not args.no_resume, samples=args.samples,
                            identity={**identity, **agent_identity(args.agent or args.agent_command, agent),
                                      "verifier": args.verifier},
                        )
                    else:
                        rescore = Rescorer(args.verifier, {t.id: t for t in tasks}, args.concurrency) \
                            if args.verifier else None
                        summary = evaluate(
                            lambda h=harness: sleuth.make(args.env, harness=h, **env_args), tasks, policy,
                            out / run if multi else out, sampling, args.concurrency, args.env,
                            meta={"tasks": args.tasks, "harness": harness, "run": run}, resume=not args.no_resume,
                            samples=args.samples, env_threads=args.env_threads, rescore=rescore,
                            identity={**identity, "env": args.env, "env_args": env_args, "harness": harness,
                                      **({"verifier": args.verifier} if args.verifier else {})},
                            episode_timeout_s=(EPISODE_TIMEOUT_S if args.episode_timeout is None
                                               else args.episode_timeout or None),
                        )
                except ValueError as e:  # e.g. a baseline that does not apply to this env
                    return _fail(f"{run}: {e} (finished episodes are kept in {out})")
                except OSError as e:  # the output cannot be written (a read-only or virtual file system)
                    return _fail(f"cannot write the run to {out}: {e.strerror or e}")
                summaries.append(summary)
                if tasks and all(t.source.startswith("bfcl/") for t in tasks):  # BFCL items: the leaderboard table
                    from sleuth.agents.eval.bfcl_table import bfcl_report

                    run_dir = out / run if multi else out
                    print(bfcl_report([run_dir], run_dir))
                if summary["n_failed"]:  # no answer from these: retried by the same command, never scored
                    errors = [t.error for t in load_trajectories((out / run if multi else out) / "trajectories.jsonl")
                              if t.failed]
                    first = one_line(errors[0], 300) if errors else "see the report"
                    failures.append(f"{run}: {summary['n_failed']} of {summary['n'] + summary['n_failed']} "
                                    f"episodes failed ({first})")
                if summary["n"] == 0:  # nothing ran (e.g. DocRead on tasks without documents): not a result
                    return _fail(f"{run}: no episode ran ({summary['n_failed']} failed: {first}); the report in "
                                 f"{out} lists every error")
        if multi:
            write_comparison(out, summaries)
            _print_table(summaries)
            print(f"\nreport: {out / 'comparison.md'}")
        else:
            print(json.dumps(summaries[0], indent=2))
            print(f"report: {out / 'report.md'}")
    finally:
        stack.close()
        if owned:
            lock.release()
    if failures:  # the means above are over the episodes that ran; the failed ones are no answer
        return _fail(f"{'; '.join(failures)}; they are not scored: run the same command again to retry them")
    return 0


def _load_policy(spec: str, args: argparse.Namespace) -> tuple[Any, Callable[[], None]]:
    """The policy named `spec` and what releases it: with `--cluster ray` a model runs in
    `--rollout-workers` Ray actors (restarted when they die, their requests re-sent); scripted baselines
    always run here."""
    from sleuth.agents.policies.load import SCRIPTED_POLICIES, load_policy

    if args.cluster != "ray" or spec in SCRIPTED_POLICIES:
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


def _run_names(specs: list[str]) -> dict[str, str]:
    """A directory name per policy: its last path part (`oracle`, `hf`), widened with the parent folder's
    name where two policies would share one (`sft_hf`, `train_hf`)."""
    clean = lambda s: re.sub(r"[^A-Za-z0-9_.-]+", "_", s)  # noqa: E731
    short = {s: clean(Path(s).name) for s in specs}
    taken = [n for n in short.values()]
    return {s: clean(f"{Path(s).parent.name}_{Path(s).name}") if taken.count(n) > 1 else n for s, n in short.items()}


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


def add_eval_parser(sub: Any) -> None:
    """Register `eval` on the `sleuth` subparsers."""
    from sleuth.agents.policies.load import SCRIPTED_POLICIES
    from sleuth.agents.policies.models import EMBEDDED
    from sleuth.envs.parsers import PARSERS
    from sleuth.verifiers.registry import verifier_names

    e = sub.add_parser("eval", help="evaluate policies on held-out tasks")
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
    e.set_defaults(fn=cmd_eval, on_interrupt="interrupted: what finished is kept; run the same command again to resume")
