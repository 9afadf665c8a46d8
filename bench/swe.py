"""SWE costs, measured on the shipped task sets (real PyPI packages, their own tests, the sandbox).

Run: `.venv/bin/python bench/swe.py [--build-n 10] [--reps 5] [--all]` (part of `make bench`).

- workspace creation (what an episode's reset costs): hard links (the default) vs a full copy, side by
  side on each package's clean source, plus the whole `SWEEnv.reset` (workspace + bug patch);
- `run_tests` latency (the failing tests of the statement, in the sandbox) and verifier latency (the
  gold patch on a clean copy: F2P + P2P), per package;
- task build throughput: a fresh `SWEBuilder` of `--build-n` tasks per package, baseline run included;
- `--all`: the scripted gold agent and the do-nothing agent on every shipped task (must be 100% / 0%).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from common import publish

import sleuth
from sleuth.sandbox.repos import RepoCache, RepoSpec
from sleuth.sandbox.workspace import make_workspace, remove_workspace
from sleuth.synth.swe import SWEBuilder
from sleuth.tasks.swe import load_swe, shipped_sets
from sleuth.verifiers.swe import SWEVerifier


def timed(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def med_ms(xs: list[float]) -> float:
    return round(1000 * statistics.median(xs), 1)


def workspace_rows(sets: list[str], reps: int) -> list[str]:
    cache = RepoCache()
    rows = ["| package | files | hard links ms | copy ms | copy / hard links | env.reset ms |",
            "|---|---|---|---|---|---|"]
    env = sleuth.make("sleuth/SWE-v0")
    for name in sets:
        task = load_swe(name)[0]
        clean = cache.source(RepoSpec.from_dict(task.payload["sdist"]))
        files = sum(1 for p in clean.rglob("*") if p.is_file())
        res = {}
        for mode in ("hardlink", "copy"):  # interleaved rounds: both see the same machine state
            res[mode] = []
        for _ in range(reps):
            for mode in ("hardlink", "copy"):
                t = time.perf_counter()
                ws = make_workspace(clean, mode=mode)
                res[mode].append(time.perf_counter() - t)
                remove_workspace(ws)
        resets = timed(lambda t=task: env.reset(options={"task": t}), reps)
        h, c = med_ms(res["hardlink"]), med_ms(res["copy"])
        rows.append(f"| {name} | {files} | {h} | {c} | {c / h:.1f}x | {med_ms(resets)} |")
    env.close()
    return rows


def latency_rows(sets: list[str], reps: int) -> list[str]:
    rows = ["| package | run_tests (F2P) s | tests run | verifier (gold) s | F2P + P2P tests |",
            "|---|---|---|---|---|"]
    verifier = SWEVerifier()
    for name in sets:
        task = load_swe(name)[0]
        env = sleuth.make("sleuth/SWE-v0")
        env.reset(options={"task": task})
        tool = env.unwrapped.tools["run_tests"].fn
        runs = timed(lambda f=tool: f(""), reps)
        counted = sum(env.unwrapped._last_tests["counts"].values())
        env.close()
        rec = {**task.payload, "patch": task.answer}
        scores = []
        ver = timed(lambda r=rec, out=scores: out.append(verifier(r, r["patch"]).score), reps)
        assert all(s == 1.0 for s in scores), f"gold patch of {task.id} did not verify"
        n = len(json.loads(rec["FAIL_TO_PASS"])) + len(json.loads(rec["PASS_TO_PASS"]))
        rows.append(f"| {name} | {statistics.median(runs):.2f} | {counted} | {statistics.median(ver):.2f} | {n} |")
    return rows


def build_rows(sets: list[str], n: int) -> list[str]:
    rows = ["| package | tasks | wall s | tasks / minute | mutants tried | baseline tests |",
            "|---|---|---|---|---|---|"]
    for name in sets:
        spec = load_swe(name)[0].payload["sdist"]
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            s = SWEBuilder(f"{spec['name']}=={spec['version']}", Path(tmp) / "t.jsonl", n=n, seed=1,
                           progress=False).build()
            wall = time.perf_counter() - t
        rows.append(f"| {name} | {s['tasks']} | {wall:.1f} | {60 * s['tasks'] / wall:.1f} | {s['tried']} | "
                    f"{s['passing_tests']} |")
    return rows


def agent_rows(sets: list[str]) -> list[str]:
    from sleuth.agents.eval.episodes import evaluate_env
    from sleuth.agents.policies.base import SamplingParams
    from sleuth.agents.policies.load import load_policy

    rows = ["| package | tasks | gold agent solved | do-nothing solved | gold wall s |", "|---|---|---|---|---|"]
    for name in sets:
        tasks = load_swe(name)
        res = {}
        for pol in ("oracle", "noop"):
            with tempfile.TemporaryDirectory() as tmp:
                t = time.perf_counter()
                s = evaluate_env(lambda: sleuth.make("sleuth/SWE-v0"), tasks, load_policy(pol), Path(tmp),
                             SamplingParams(max_tokens=64), 4, "sleuth/SWE-v0", resume=False, env_threads=2,
                             progress=False)
                res[pol] = (s["score"], time.perf_counter() - t)
        rows.append(f"| {name} | {len(tasks)} | {res['oracle'][0]:.3f} | {res['noop'][0]:.3f} | "
                    f"{res['oracle'][1]:.0f} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--build-n", type=int, default=10, help="tasks built per package (0: skip)")
    ap.add_argument("--all", action="store_true", help="also run the gold and do-nothing agents on every task")
    args = ap.parse_args()
    sets = shipped_sets()
    parts = ["## Workspace creation (episode reset)", *workspace_rows(sets, args.reps),
             "", "## Test and verifier latency (median)", *latency_rows(sets, args.reps)]
    if args.build_n:
        parts += ["", f"## Task build throughput ({args.build_n} tasks, from a cold baseline)",
                  *build_rows(sets, args.build_n)]
    if args.all:
        parts += ["", "## Scripted agents on every shipped task", *agent_rows(sets)]
    publish("swe", "SWE env", "\n".join(parts))


if __name__ == "__main__":
    main()
