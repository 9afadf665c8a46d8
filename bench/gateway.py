"""Agents through the OpenAI-compatible gateway vs sleuth's own agent loop, and the gateway's own cost per call,
measured side by side in one run.

Run: `.venv/bin/python bench/gateway.py [episodes] [overhead] [vllm] [--quick]` (all three by default; part of
`make bench`). Prints a Markdown report and writes it to runs/bench/gateway.md.

- episodes: the same HotpotQA test tasks (`--tasks`), engine (transformers, the embedded SmolLM2 unless
  `--model`; greedy unless `--temperature`), concurrency, turn budget and max_tokens, run by
  (A) sleuth's own loop (`run_episodes` over `sleuth.make("DocRead-v0", harness="json")`) and
  (B) `DocReadAgent`, a DocRead-like agent written against the `openai` SDK alone (the same `read(doc)` /
  `answer(text)` tools, implemented by the agent over `task["payload"]["docs"]`), through the gateway served in
  this process (`run_agent_episodes`, verifier "qa"), as `sleuth eval --agent` runs it. A fresh engine per arm
  (no KV state carried over). Episodes/min and B/A, turns, generated and prompt tokens per episode, generated
  tokens/s, the engine's busy share, and whether both arms sent the same prompts.
- overhead: the gateway in front of a policy that answers at once (a test double: a fixed short tool call, as
  ids of the real SmolLM2 tokenizer), `--sessions` sessions at once (and one at a time), each `--calls` calls
  of a growing DocRead-like conversation, through the `openai` SDK and through raw httpx (the SDK's own client
  cost apart); then with the engine paced at `--engine-ms` a call, where the gateway's own part of a call is
  its latency less its time in the engine. The gateway in a process of its own (its CPU time per call measured
  there) and in this process; floors: `Gateway.complete` without HTTP, and the policy alone. Then where one
  unloaded call's time goes.
- vllm: arms A and B on a vLLM server (only where `.venv-vllm/bin/python` exists, or $SLEUTH_VLLM_PYTHON).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sleuth.core.args import bounded

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the two modules beside this script
from gateway_agent import INSTRUCTIONS, TOOLS, DocReadAgent  # noqa: E402
from gateway_instant import serve_instant  # noqa: E402
from gateway_overhead import overhead_section  # noqa: E402

SECTIONS = ("episodes", "overhead", "vllm")
QUICK = {"tasks": 2, "concurrency": 2, "sessions": 8, "calls": 4}
DEFAULTS = {"tasks": 8, "concurrency": 8, "sessions": 64, "calls": 16}

# -- section episodes: arm A (sleuth's loop) vs arm B (the agent through the gateway) ---------------------------
class Busy:
    """A policy wrapper that counts `generate` calls, their requests and the time during which at least one runs."""

    def __init__(self, inner: Any):
        self.inner, self.name, self.tokenizer = inner, inner.name, inner.tokenizer
        self.parallel_calls = inner.parallel_calls
        self.busy_s, self.calls, self.requests, self._active, self._since = 0.0, 0, 0, 0, 0.0
        self._lock = threading.Lock()

    @property
    def version(self) -> int:
        return self.inner.version

    @property
    def max_context(self) -> int | None:
        return self.inner.max_context

    def generate(self, requests: list[Any], sampling: Any) -> list[Any]:
        with self._lock:
            if self._active == 0:
                self._since = time.perf_counter()
            self._active += 1
            self.calls += 1
            self.requests += len(requests)
        try:
            return self.inner.generate(requests, sampling)
        finally:
            with self._lock:
                self._active -= 1
                if self._active == 0:
                    self.busy_s += time.perf_counter() - self._since


@dataclass
class Arm:
    name: str
    wall_s: float
    episodes: dict[str, list[Any]]  # task id → the episode's records, in segment order
    busy_s: float
    calls: int
    requests: int

    def stats(self) -> dict[str, float]:
        eps = list(self.episodes.values())
        ok = [e for e in eps if not any(t.failed for t in e)]
        records = [t for e in ok for t in e]
        gen = sum(t.num_policy_tokens for t in records)
        prompt = 0
        for t in records:  # each call's prompt is the whole context so far
            ctx = len(t.prompt_ids)
            for turn in t.turns:
                prompt += ctx
                ctx += len(turn.action_ids) + len(turn.observation_ids)
        n = max(1, len(ok))
        return {"episodes": len(eps), "failed": len(eps) - len(ok), "wall_s": self.wall_s,
                "per_min": 60 * len(ok) / self.wall_s, "turns": sum(len(t.turns) for t in records) / n,
                "gen": gen / n, "prompt": prompt / n, "gen_tok_s": gen / self.wall_s, "busy": self.busy_s / self.wall_s,
                "calls": self.calls, "batch": self.requests / max(1, self.calls),
                "reward": statistics.mean(t.reward for t in records) if records else 0.0}


def _progress(total: int, desc: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="episode", file=sys.stderr, leave=False)


def warm_up(policy: Any, prompt: list[int]) -> None:
    """One short call on a prompt of no measured task, so neither arm pays the engine's first-call costs."""
    from sleuth.agents.policies.base import Request, SamplingParams
    from sleuth.tasks.base import Task

    policy.generate([Request(prompt, [], Task(id="warm-up", question=""))], SamplingParams(max_tokens=4))


def loop_arm(policy: Busy, tasks: list[Any], sampling: Any, concurrency: int, budget: int) -> Arm:
    import sleuth
    from sleuth.agents.loop.episodes import run_episodes

    make = lambda: sleuth.make("DocRead-v0", harness="json", budget=budget)  # noqa: E731
    episodes: dict[str, list[Any]] = {}
    with _progress(len(tasks), "A: sleuth loop") as bar:
        start = time.perf_counter()
        for t in run_episodes(make, tasks, policy, sampling, concurrency):
            episodes[t.task_id] = [t]
            bar.update()
        wall = time.perf_counter() - start
    return Arm("A: sleuth loop, DocRead-v0", wall, episodes, policy.busy_s, policy.calls, policy.requests)


def gateway_arm(policy: Busy, tasks: list[Any], sampling: Any, concurrency: int, budget: int) -> Arm:
    from sleuth.agents.gateway import Gateway, create_app
    from sleuth.agents.gateway.agent_runner import run_agent_episodes
    from sleuth.core.net import in_thread

    gw = Gateway(policy, sampling)
    agent = DocReadAgent(budget, sampling.max_tokens, sampling.temperature, sampling.seed)
    episodes: dict[str, list[Any]] = {}
    try:
        with in_thread(create_app(gw)) as url, _progress(len(tasks), "B: openai agent → gateway") as bar:
            start = time.perf_counter()
            for t in run_agent_episodes(agent, tasks, gw, url, "qa", concurrency):
                episodes.setdefault(t.task_id, []).append(t)
                bar.update(t.segment == t.segments - 1 or t.failed)
            wall = time.perf_counter() - start
    finally:
        gw.close()
    return Arm("B: openai-SDK agent → gateway", wall, episodes, policy.busy_s, policy.calls, policy.requests)


def sameness(a: Arm, b: Arm) -> str:
    """How alike the two arms' work was: first prompts and whole token sequences, task by task."""
    first = whole = 0
    for task_id, ea in a.episodes.items():
        eb = b.episodes.get(task_id, [])
        if not eb or any(t.failed for t in ea + eb):
            continue
        first += ea[0].prompt_ids == eb[0].prompt_ids
        whole += len(eb) == 1 and ea[0].token_ids() == eb[0].token_ids()
    return (f"first prompts token-identical in {first}/{len(a.episodes)} tasks; whole episodes token-identical in "
            f"{whole}/{len(a.episodes)} (expected to part after a reply without a tool call: the env answers it "
            "with a tool message, the agent with a user message, as the API has no tool message without a call)")


def arms_table(engine: str, a: Arm, b: Arm) -> list[str]:
    sa, sb = a.stats(), b.stats()
    out = ["| engine · arm | episodes (failed) | wall s | episodes/min | B/A | turns/episode | "
           "generated tok/episode | prompt tok/episode (all calls) | generated tok/s | B/A | engine busy | "
           "engine calls | requests per call | mean reward |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm, s in ((a, sa), (b, sb)):
        out.append(f"| {engine} · {arm.name} | {s['episodes']} ({s['failed']}) | {s['wall_s']:.1f} | "
                   f"{s['per_min']:.2f} | {s['per_min'] / sa['per_min']:.2f}× | {s['turns']:.2f} | {s['gen']:.1f} | "
                   f"{s['prompt']:.0f} | {s['gen_tok_s']:.1f} | {s['gen_tok_s'] / sa['gen_tok_s']:.2f}× | "
                   f"{s['busy']:.0%} | {s['calls']} | {s['batch']:.2f} | {s['reward']:.3f} |")
    out += ["", f"Same work? {sameness(a, b)}."]
    return out


def check_agent_matches_env() -> None:
    """Arm B's prompt must be the env's: its instructions and tool schemas are DocRead-v0's."""
    import sleuth

    env = sleuth.make("DocRead-v0", harness="json").unwrapped
    if env.instructions != INSTRUCTIONS or env._schemas != TOOLS:
        raise SystemExit("bench/gateway.py: DocReadAgent's INSTRUCTIONS/TOOLS no longer match DocRead-v0's: "
                         "update them")


def episodes_section(args: argparse.Namespace, tasks: list[Any], warm: list[int]) -> list[str]:
    from sleuth.agents.policies.base import SamplingParams
    from sleuth.agents.policies.load import load_policy

    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    arms = []
    for run in (loop_arm, gateway_arm):  # a fresh engine per arm: no KV state kept from the other arm
        policy = Busy(load_policy(args.model, max_batch=max(8, args.concurrency)))
        warm_up(policy.inner, warm)
        arms.append(run(policy, tasks, sampling, args.concurrency, args.budget))
        print(f"  {arms[-1].name}: {arms[-1].stats()['per_min']:.2f} episodes/min", file=sys.stderr, flush=True)
    head = (f"{len(tasks)} HotpotQA test tasks, {args.concurrency} episodes live, budget {args.budget} reads, "
            f"max_tokens {args.max_tokens}, {_sampling_words(args)}, engine transformers `{args.model}` "
            f"(max_batch {max(8, args.concurrency)}, a fresh one per arm):")
    return [head, "", *arms_table("transformers", *arms), "",
            "Requests per call: how many episodes' turns the engine batched into one `generate` call."]


def _sampling_words(args: argparse.Namespace) -> str:
    return "greedy" if args.temperature == 0 else f"T = {args.temperature:g}, seed {args.seed}"


def vllm_section(args: argparse.Namespace, tasks: list[Any], warm: list[int]) -> list[str]:
    from sleuth.training.rollout.vllm_servers import default_vllm_python

    python = default_vllm_python()
    if python is None or not Path(python).exists():
        reason = "vLLM arm skipped: no .venv-vllm/bin/python (`make vllm` builds it) and no $SLEUTH_VLLM_PYTHON"
        print(reason, file=sys.stderr)
        return [reason]
    import httpx

    from sleuth.agents.policies.base import SamplingParams
    from sleuth.agents.policies.models import resolve_model
    from sleuth.training.config import load_config
    from sleuth.training.rollout.vllm_servers import VLLMRollout
    from sleuth.training.zero import resolved_dtype

    print(f"… starting a vLLM server with {python}", file=sys.stderr, flush=True)
    cfg = load_config(overrides={"rollout.inference": "vllm", "rollout.concurrency": args.concurrency})
    vllm = VLLMRollout(cfg.rollout, resolve_model(args.model), warm[:8], cfg.update.sync_tolerance_vllm,
                       dtype=resolved_dtype(cfg.deepspeed))  # a trainer's engine would run in it
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    arms = []
    try:
        for run in (loop_arm, gateway_arm):
            for url in vllm.urls:  # no prefix cached by the other arm
                httpx.post(f"{url}/reset_prefix_cache", timeout=60).raise_for_status()
            policy = Busy(vllm.policy)
            warm_up(policy, warm)
            policy.busy_s, policy.calls, policy.requests = 0.0, 0, 0
            arms.append(run(policy, tasks, sampling, args.concurrency, args.budget))
            print(f"  vLLM {arms[-1].name}: {arms[-1].stats()['per_min']:.2f} episodes/min", file=sys.stderr,
                  flush=True)
    finally:
        vllm.close()
    head = (f"The same tasks and settings on one vLLM server (`{python}`, prefix caching on, reset between arms; "
            "each request its own call, batched by the server):")
    return [head, "", *arms_table("vLLM", *arms)]


# -- main ----------------------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # no `choices` here: Python 3.11's argparse checks a list default against them and refuses it
    ap.add_argument("sections", nargs="*", metavar="SECTION",
                    help=f"what to measure: {', '.join(SECTIONS)} (default: all)")
    ap.add_argument("--tasks", type=bounded(int, 1), help=f"HotpotQA test tasks per arm (default {DEFAULTS['tasks']})")
    ap.add_argument("--concurrency", type=bounded(int, 1),
                    help=f"episodes live at once, both arms (default {DEFAULTS['concurrency']})")
    ap.add_argument("--sessions", type=bounded(int, 1),
                    help=f"overhead: concurrent gateway sessions (default {DEFAULTS['sessions']})")
    ap.add_argument("--calls", type=bounded(int, 1), help=f"overhead: calls per session (default {DEFAULTS['calls']})")
    ap.add_argument("--quick", action="store_true",
                    help="small sizes for a smoke run: " + ", ".join(f"--{k} {v}" for k, v in QUICK.items()))
    ap.add_argument("--model", default="smollm2", help="the engine's model (default: the embedded SmolLM2)")
    ap.add_argument("--budget", type=bounded(int, 0), default=3, help="non-final turns per episode (DocRead's reads)")
    ap.add_argument("--max-tokens", type=bounded(int, 1), default=64, help="tokens per turn, both arms")
    ap.add_argument("--temperature", type=bounded(float, 0), default=0.0, help="0: greedy (default)")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed when --temperature > 0")
    ap.add_argument("--engine-ms", type=bounded(float, 0), default=100.0,
                    help="overhead: the paced engine's time per call in the third set of rows (default 100)")
    ap.add_argument("--dry-run", action="store_true", help="print the resolved settings and exit")
    ap.add_argument("--serve-instant", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    unknown = [x for x in args.sections if x not in SECTIONS]
    if unknown:
        ap.error(f"unknown section {unknown[0]!r}: choose from {', '.join(SECTIONS)}")
    if args.serve_instant is not None and not 1 <= args.serve_instant <= 65535:
        ap.error(f"--serve-instant wants a port, got {args.serve_instant}")
    for key, default in DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, QUICK[key] if args.quick else default)
    args.sections = list(dict.fromkeys(args.sections or SECTIONS))
    return args


def command_line() -> str:
    python = Path(sys.executable)
    try:
        python = python.relative_to(Path.cwd())
    except ValueError:
        pass
    return shlex.join([str(python), *sys.argv])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.serve_instant is not None:
        serve_instant(args.serve_instant)
        return
    settings = {k: getattr(args, k) for k in ("sections", "tasks", "concurrency", "sessions", "calls", "model",
                                             "budget", "max_tokens", "temperature", "seed", "engine_ms")}
    if args.dry_run:
        print(json.dumps(settings))
        return
    from common import publish

    from sleuth.agents.chat import ChatRenderer
    from sleuth.core.machine import cpu_name
    from sleuth.tasks import load_tasks

    check_agent_matches_env()
    load = os.getloadavg()[0]
    loaded = load_tasks("hotpotqa:test", limit=args.tasks + 1)
    tasks, spare = loaded[:args.tasks], loaded[-1]  # the spare task warms engines up and drives the overhead runs
    parts = []
    if {"episodes", "vllm"} & set(args.sections):
        from sleuth.agents.policies.load import load_tokenizer

        tok = load_tokenizer(args.model)
        warm = ChatRenderer(tok).prompt_ids([{"role": "user", "content": spare.question}])
    for section in args.sections:
        print(f"… {section}", file=sys.stderr, flush=True)
        if section == "episodes":
            lines = episodes_section(args, tasks, warm)
        elif section == "vllm":
            lines = vllm_section(args, tasks, warm)
        else:
            lines = overhead_section(args, spare)
        parts.append(f"## {section}\n\n" + "\n".join(lines))
        print(parts[-1], file=sys.stderr, flush=True)  # the whole report goes to stdout at the end
    head = (f"{cpu_name()}; load average {load:.2f} when it started. Command: `{command_line()}`.\n\n"
            "Targets (issue 33): B/A ≥ 0.8× episodes/min with transformers; gateway p50 ≤ 2 ms per call excluding "
            "generation.")
    publish("gateway", "Agents through the gateway vs sleuth's own loop; the gateway's cost per call",
            head + "\n\n" + "\n\n".join(parts))


if __name__ == "__main__":
    main()
