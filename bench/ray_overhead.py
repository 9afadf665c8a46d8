"""Episodes/min of the agent loop through sleuth's Ray rollout workers vs the local engine, side by side in one run.

Run: `.venv/bin/python bench/ray_overhead.py [--quick]` (part of `make bench`). Prints a Markdown report and writes
it to runs/bench/ray_overhead.md; `--quick` (the tiny random model, 4 questions) checks the plumbing and writes
nothing, so its figures never stand in for SmolLM2's.

Every arm runs the same N HotpotQA test questions in DocRead-v0 (text harness, greedy, 48 tokens a turn, all N
live at once unless `--concurrency`) with the embedded SmolLM2 in fp32, on this machine's C cores:
- A local: one `TransformersPolicy` in this process, C torch threads (`cluster.backend: local`);
- B ray × 1: one `RolloutWorker` actor with worker_cpus = C: A's compute plus the actor hop and object transfer;
- C ray × 2: two workers of C/2 CPUs each behind the router (only where C ≥ 2).
Each arm gets a fresh engine per repeat (no KV state carried over) and one warm-up generation; only the episodes
are timed. Ray is up only for the Ray arms (started before them, shut down before A), so arm A pays nothing for
its daemons, as a local user would not. The arm order alternates between repeats (A B C, C B A, …) and the
median is reported, so a background load drifting over the run does not bias one arm. Start-up costs (Ray start,
engine start, warm-up) are reported apart. Greedy decoding with the same weights must give the same episodes:
each arm's token ids are compared with A's first run's, episode by episode.

Target: B/A ≥ 0.9× episodes/min (Ray must not cost the single-machine user).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sleuth.core.args import bounded

ENV = "sleuth/DocRead-v0"
TARGET = 0.9


@dataclass
class Arm:
    """One way to run the engine: `workers` Ray actors of `cpus` CPUs each, or (0) in this process."""

    name: str
    workers: int
    cpus: int
    seconds: list[float] = field(default_factory=list)  # one per repeat: the episodes only
    engine_s: list[float] = field(default_factory=list)  # model load (and actors up)
    warm_s: list[float] = field(default_factory=list)
    same: int = 0  # episodes whose token ids equal A's first run's, over all repeats
    compared: int = 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="plumbing check: the tiny random model and 4 questions; nothing is written")
    ap.add_argument("--tasks", type=bounded(int, 1), help="HotpotQA test questions per arm (default 16, --quick 4)")
    ap.add_argument("--repeats", type=bounded(int, 1), default=2, help="runs per arm, order alternating (median)")
    ap.add_argument("--concurrency", type=bounded(int, 1), help="episodes live at once (default: all of them)")
    ap.add_argument("--max-tokens", type=bounded(int, 1), default=48, help="tokens per turn")
    args = ap.parse_args(argv)
    args.tasks = args.tasks or (4 if args.quick else 16)
    args.concurrency = args.concurrency or args.tasks
    return args


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def arms(n: int) -> list[Arm]:
    out = [Arm(f"A local, {n} threads", 0, n), Arm(f"B ray, 1 worker × {n} CPUs", 1, n)]
    if n >= 2:
        out.append(Arm(f"C ray, 2 workers × {n // 2} CPUs", 2, n // 2))
    return out


def start_engine(arm: Arm, model_path: str, max_batch: int) -> tuple[Any, list[Any], Callable[[], None]]:
    """(the policy the loop calls, the engines to warm up one by one, what releases them)."""
    import torch

    if arm.workers == 0:
        from sleuth.agents.policies.hf import TransformersPolicy

        torch.set_num_threads(arm.cpus)
        policy = TransformersPolicy(model_path, device="cpu", dtype=torch.float32, max_batch=max_batch)
        return policy, [policy], lambda: None
    from sleuth.training.cluster.placement import ClusterConfig
    from sleuth.training.cluster.rollout_workers import WorkerPool

    cluster = ClusterConfig(backend="ray", rollout_workers=arm.workers, worker_cpus=arm.cpus)
    pool = WorkerPool(cluster, model_path, torch.float32, max_batch=max_batch)
    return pool.policy, pool.handles, pool.close


def run_arm(arm: Arm, model_path: str, tasks: list[Any], warm: list[int],
            args: argparse.Namespace) -> dict[str, list[int]]:
    """One timed run of `arm` on a fresh engine: task id → its episode's token ids."""
    import sleuth
    from sleuth.agents.loop.episodes import run_episodes
    from sleuth.agents.policies.base import Request, SamplingParams

    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    t = time.perf_counter()
    policy, engines, close = start_engine(arm, model_path, args.concurrency)
    try:
        arm.engine_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        for engine in engines:  # first-call costs (kernels, the actor's method) are start-up, not episodes
            engine.generate([Request(warm, [], None)], sampling)
        arm.warm_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        trajs = list(run_episodes(lambda: sleuth.make(ENV, harness="text"), tasks, policy, sampling,
                                  args.concurrency, env_id=ENV))
        arm.seconds.append(time.perf_counter() - t)
    finally:
        close()
    failed = [t.error for t in trajs if t.error]
    if len(trajs) != len(tasks) or failed:
        raise RuntimeError(f"{arm.name}: {len(trajs)} of {len(tasks)} episodes came back, {len(failed)} failed: "
                           f"{failed[:1]}")
    print(f"… {arm.name}: {arm.seconds[-1]:.1f} s", file=sys.stderr, flush=True)
    return {t.task_id: t.token_ids() for t in trajs}


def measure(model_path: str, args: argparse.Namespace) -> tuple[list[Arm], list[float]]:
    """Every arm `args.repeats` times, the order reversed each repeat; Ray is up only around the Ray arms.
    Returns the arms (their episodes compared with A's first run's) and the Ray start times."""
    import ray

    from sleuth.agents.chat import ChatRenderer
    from sleuth.agents.policies.load import load_tokenizer
    from sleuth.tasks import load_tasks

    loaded = load_tasks("hotpotqa:test", limit=args.tasks + 1)
    tasks, spare = loaded[:args.tasks], loaded[-1]  # the spare question warms the engines up
    warm = ChatRenderer(load_tokenizer(model_path)).prompt_ids([{"role": "user", "content": spare.question}])
    n = cores()
    todo, ray_start = arms(n), []
    runs: dict[str, list[dict[str, list[int]]]] = {arm.name: [] for arm in todo}
    try:
        for r in range(args.repeats):
            for arm in todo if r % 2 == 0 else todo[::-1]:
                if arm.workers and not ray.is_initialized():
                    t = time.perf_counter()
                    ray.init(num_cpus=n, include_dashboard=False, log_to_driver=False, configure_logging=False)
                    ray_start.append(time.perf_counter() - t)
                elif not arm.workers and ray.is_initialized():
                    ray.shutdown()
                runs[arm.name].append(run_arm(arm, model_path, tasks, warm, args))
    finally:
        if ray.is_initialized():
            ray.shutdown()
    reference = runs[todo[0].name][0]
    for arm in todo:
        arm.same = sum(ids[k] == want for ids in runs[arm.name] for k, want in reference.items())
        arm.compared = len(reference) * len(runs[arm.name])
    return todo, ray_start


def report(todo: list[Arm], ray_start: list[float], args: argparse.Namespace, head: str) -> str:
    median = statistics.median
    base = args.tasks / median(todo[0].seconds)
    rows = ["| arm | episodes | seconds | episodes/min | vs local | runs (s) | same episodes as A's first run |",
            "|---|---|---|---|---|---|---|"]
    for arm in todo:
        rate = args.tasks / median(arm.seconds)
        rows.append(f"| {arm.name} | {args.tasks} | {median(arm.seconds):.1f} | {60 * rate:.1f} | "
                    f"{rate / base:.2f}× | {', '.join(f'{s:.1f}' for s in arm.seconds)} | {arm.same}/{arm.compared} |")
    a, b = todo[0], todo[1]
    ratio = median(a.seconds) / median(b.seconds)
    same = a.same == a.compared and b.same == b.compared
    verdict = (f"B/A = {ratio:.2f}× episodes/min (target ≥ {TARGET}×: {'met' if ratio >= TARGET else 'MISSED'}). "
               f"A and B give the same trajectories (token ids, every episode, every repeat): "
               f"{'yes' if same else 'NO'}.")
    startup = ["| start-up (median, not in the seconds above) | seconds |", "|---|---|",
               f"| Ray start (`ray.init`, a local cluster of {cores()} CPUs) | {median(ray_start):.1f} |"]
    for arm in todo:
        what = "model load" if not arm.workers else "placement group, actors up, model loaded in each"
        startup += [f"| {arm.name}: engine ({what}) | {median(arm.engine_s):.1f} |",
                    f"| {arm.name}: warm-up (one generation on each engine) | {median(arm.warm_s):.2f} |"]
    return "\n".join([head, "", *rows, "", verdict, "", *startup])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from common import publish

    from sleuth.agents.policies.models import resolve_model, tiny_model
    from sleuth.core.machine import cpu_name

    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        model_path = tiny_model(os.path.join(tmp, "model")) if args.quick else resolve_model("smollm2")
        todo, ray_start = measure(model_path, args)
    model = "a tiny random model" if args.quick else "SmolLM2-135M"
    head = (f"{cpu_name()}, {cores()} cores; load average {load:.2f} when it started. {args.tasks} HotpotQA test "
            f"questions in {ENV} (text harness), {args.concurrency} live, greedy, {args.max_tokens} tokens a turn, "
            f"{model} fp32; median of {args.repeats} runs per arm, the order alternating.")
    text = report(todo, ray_start, args, head)
    if args.quick:
        print(text + "\n\n(--quick: a plumbing check on a random model; nothing written)")
    else:
        publish("ray_overhead", "The agent loop through Ray rollout workers vs the local engine", text)


if __name__ == "__main__":
    main()
