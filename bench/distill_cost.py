"""What on-policy distillation costs beside RL: CPU seconds per step and peak memory, side by side in one run.

Each arm trains `configs/docread_cigpo.yaml` (CIGPO, 2 tasks × a group of 4 = 8 episodes a step) from the same
model, seeds and tasks, for a warm-up step and MEASURED steps, each arm in a fresh process (its peak RSS is its
own: `ru_maxrss` of that process). Arms:
- `RL alone`: the recipe;
- `RL + local teacher`: the recipe plus `algorithm.distill` from a second copy of a model of the student's size
  (the start model itself, loaded as the teacher: its own weights in memory, no optimizer state, no gradients),
  sampled-token reverse KL;
- `RL + self teacher, privileged`: the teacher is the policy itself with the gold supporting documents before
  each episode (no second model; a longer forward per trajectory).
The issue's target: a local teacher of the student's size at ≤ 1.5× the CPU seconds per step and ≤ 1.5× the
peak memory of RL alone.

Run: `.venv/bin/python bench/distill_cost.py [--model DIR]` (default: the warm start `runs/main/sft/hf` that
`make run` writes, else SmolLM2 itself).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
from pathlib import Path

from common import publish, run_arm, train_recipe

from sleuth.core.machine import cpu_name

STEPS = 3  # the first is a warm-up


def arms(model: str) -> dict[str, dict]:
    return {
        "RL alone": {},
        "RL + local teacher": {"algorithm.distill": {"teacher": model}},
        "RL + self teacher, privileged": {"algorithm.distill": {"teacher": "self", "teacher_context": "supporting"}},
    }


def arm(model: str, overrides: dict) -> dict:
    """One arm in this process: train STEPS steps; the per-step rows and this process's peak RSS."""
    _, rows = train_recipe(model, STEPS, overrides)
    return {"rows": rows, "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="start model (default: runs/main/sft/hf if present, else smollm2)")
    ap.add_argument("--arm", help=argparse.SUPPRESS)
    args = ap.parse_args()
    model = args.model or ("runs/main/sft/hf" if Path("runs/main/sft/hf/config.json").exists() else "smollm2")
    if args.arm:
        print(json.dumps(arm(model, arms(model)[args.arm])))
        return
    results = {name: run_arm(__file__, name, ("--model", model)) for name in arms(model)}
    lines = [f"Model `{model}`, `configs/docread_cigpo.yaml`, 8 episodes a step; {cpu_name()}. Medians over steps "
             f"2–{STEPS} (step 1 is a warm-up); each arm in a fresh process, peak RSS of that process.", "",
             "| arm | CPU s / step | × RL alone | teacher s / step | peak RSS GB | × RL alone |",
             "|---|---|---|---|---|---|"]
    base_cpu = base_mem = None
    for name, res in results.items():
        rows = res["rows"][1:]
        cpu = statistics.median(r["time/step_cpu"] for r in rows)
        teacher = statistics.median(r.get("distill/teacher_s", 0.0) for r in rows)
        base_cpu, base_mem = base_cpu or cpu, base_mem or res["peak_gb"]
        lines.append(f"| {name} | {cpu:.1f} | {cpu / base_cpu:.2f} | {teacher:.1f} | {res['peak_gb']:.2f} | "
                     f"{res['peak_gb'] / base_mem:.2f} |")
    publish("distill_cost", "On-policy distillation beside RL: CPU seconds and peak memory", "\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
