"""What the `bfcl:` env adds to an episode over bfcl-eval doing the same work itself, with no model in the loop:
the oracle's replies (BFCL's possible answers) played on every item of the chosen categories, timed three ways in
one run, each over the same items, best of `--repeats`:

- bfcl-eval alone (in `.venv-bfcl`): per item what its own FC flow does besides asking the model — compile the
  tools (`convert_to_tool`), per step decode the calls (`decode_execute`) and run them on the item's backends
  (`execute_multi_turn_func_call`), then score the item (`_evaluate_single_*_entry`);
- sleuth's env in process (in `.venv-bfcl`): `reset`, a `step` per reply (parse the JSON-harness text, the same
  decoding, execution and scoring, the chat messages of the next observation);
- sleuth's env from the main venv, as `sleuth eval` and `sleuth train` use it: the same behind the Remote env
  protocol (HTTP to `sleuth serve env` in `.venv-bfcl`).

    .venv/bin/python bench/bfcl_env_overhead.py [--tasks bfcl:multi_turn_base,simple_python] [--repeats 3]"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any

TASKS = "bfcl:multi_turn_base,multi_turn_long_context,simple_python,parallel_multiple"


def replies(task: Any, tools: list[dict[str, Any]]) -> list[str]:
    """The oracle's reply texts for a whole episode, in the JSON harness."""
    from sleuth.envs.families.bfcl import BFCLEnv
    from sleuth.envs.parsers import get_parser

    parser = get_parser("json")
    n = (sum(2 if calls else 1 for calls in task.payload["ground_truth"]) if task.id.startswith("multi_turn")
         else 1)  # a multi-turn turn: its calls in one reply, then a reply without a call
    return ["\n".join(parser.render(c) for c in BFCLEnv.oracle(task, turn, {"tools": tools})) for turn in range(n)]


def bfcl_alone(task: Any, texts: list[str]) -> float:
    """bfcl-eval's own per-item work for the same replies (decoded from the same texts, as its handler would get
    them as tool calls)."""
    from sleuth.envs.families import bfcl_checker as c
    from sleuth.envs.families.bfcl import as_tools
    from sleuth.envs.parsers import get_parser

    parser = get_parser("json")
    began = time.perf_counter()
    entry = json.loads(json.dumps(task.payload["entry"]))
    offered = as_tools(c.tools(entry["function"]))
    key = c.episode_key()
    if not task.id.startswith("multi_turn"):
        calls = parser.parse(texts[0], offered).calls
        result = [{x.name: json.dumps(x.arguments)} for x in calls] if calls else texts[0]
        c.score(task.id, result, key)
        return time.perf_counter() - began
    c.execute([], entry, key)
    result, turn_steps, turn = [], [], 0
    for text in texts:
        calls = parser.parse(text, offered).calls
        if not calls:
            result.append(turn_steps)
            turn_steps, turn = [], turn + 1
            added = entry.get("missed_function", {}).get(str(turn))
            if added:
                entry["function"].extend(added)
                offered = as_tools(c.tools(entry["function"]))
            continue
        step = [{x.name: json.dumps(x.arguments)} for x in calls]
        turn_steps.append(step)
        c.execute(c.decode_execute(step), entry, key)
    c.score(task.id, result, key)
    return time.perf_counter() - began


def episode(env: Any, task: Any, texts: list[str]) -> float:
    began = time.perf_counter()
    env.reset(options={"task": task})
    for text in texts:
        _, _, done, truncated, _ = env.step(text)
        if done or truncated:
            break
    return time.perf_counter() - began


def in_bfcl_venv(spec: str, repeats: int) -> dict[str, float]:
    import sleuth
    from sleuth.envs.families.bfcl import BFCLEnv
    from sleuth.envs.outcome import reset_info
    from sleuth.tasks import load_tasks

    tasks = load_tasks(spec)
    env = BFCLEnv("all")
    plays = []
    for t in tasks:
        _, info = env.reset(options={"task": t})
        plays.append((t, replies(t, reset_info(info).tools)))
    for t, texts in plays:  # warm-up: imports, bfcl-eval's loaded entries and handler, backend modules
        bfcl_alone(t, texts)
        episode(env, t, texts)
    alone = min(sum(bfcl_alone(t, texts) for t, texts in plays) for _ in range(repeats))
    ours = min(sum(episode(env, t, texts) for t, texts in plays) for _ in range(repeats))
    del sleuth
    return {"items": len(plays), "bfcl_alone_s": alone, "env_in_process_s": ours}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default=TASKS)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)  # the half that runs in .venv-bfcl
    args = ap.parse_args()
    if args.inner:
        print(json.dumps(in_bfcl_venv(args.tasks, args.repeats)))
        return 0
    import sleuth
    from sleuth.envs.families.bfcl import BFCL
    from sleuth.envs.outcome import reset_info
    from sleuth.tasks import load_tasks

    inner = subprocess.run([BFCL.python(), "-P", os.path.abspath(__file__), "--inner", "--tasks", args.tasks,
                            "--repeats", str(args.repeats)], capture_output=True, text=True, check=True,
                           env={**os.environ, "OPENAI_API_KEY": "unused"})
    got = json.loads(inner.stdout.strip().splitlines()[-1])
    tasks = load_tasks(args.tasks)
    env = sleuth.make("bfcl:all")
    plays = []
    for t in tasks:
        _, info = env.reset(options={"task": t})
        plays.append((t, replies(t, reset_info(info).tools)))
    remote = min(sum(episode(env, t, texts) for t, texts in plays) for _ in range(args.repeats + 1))  # 1st: warm-up
    env.close()
    n, alone, ours = got["items"], got["bfcl_alone_s"], got["env_in_process_s"]
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.machine())
    print(f"BFCL env overhead, {n} items of {args.tasks}, oracle replies, best of {args.repeats}; {cpu}, "
          f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}")
    print("| path | ms per episode | × bfcl-eval alone |\n|---|---|---|")
    for name, s in (("bfcl-eval alone", alone), ("sleuth env, in process", ours),
                    ("sleuth env, main venv → Remote env (HTTP)", remote)):
        print(f"| {name} | {1000 * s / n:.2f} | {s / alone:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
