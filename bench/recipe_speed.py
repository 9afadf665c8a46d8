"""DocRead episodes per CPU-minute of `make run`'s RL recipe, side by side in one run.

Each arm trains `configs/docread_cigpo.yaml` (CIGPO, 2 tasks × a group of 4 = 8 episodes a step, SmolLM2)
from the same model, seeds and tasks, for a warm-up step and 3 measured steps, each in a fresh process;
the figure is episodes / CPU-minute of the whole step (rollout, reward, update, sync: `time/step_cpu`),
median over the measured steps, plus wall seconds, the update's share and the engine–trainer logprob
mismatch (bf16 rounds the engine's incremental decoding and the trainer's packed forward apart).

Arms:
- `recipe, fp32`: the recipe as a CPU without AMX-BF16 runs it (the ratios' base).
- `recipe`: the recipe as configured (`deepspeed.dtype: auto`: bf16 where the CPU has AMX-BF16); on a CPU
  without it `auto` is fp32, the same run as `recipe, fp32`, so this arm is left out there (the report says so).
- `recipe + LoRA r 16`: adapters on every linear layer of the body.

Run: `.venv/bin/python bench/recipe_speed.py [--model DIR]` (default: the warm start `runs/main/sft/hf`
that `make run` writes, else SmolLM2 itself; the warm start's episodes are the ones RL trains on).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from common import publish, run_arm, train_recipe

from sleuth.core.machine import cpu_name

STEPS = 4  # the first is a warm-up
ARMS = {
    "recipe, fp32": {"deepspeed.dtype": "fp32"},
    "recipe": {},
    # LoRA on every linear layer of the body: no weight gradients or optimizer states for the frozen
    # weights, but adapters in every forward and a merge at every sync (a speed arm: not tuned to learn)
    "recipe + LoRA r 16": {"deepspeed.lora": {"r": 16, "alpha": 32, "target_modules": [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}},
}


def arm(model: str, overrides: dict) -> dict:
    """One arm in this process: train STEPS steps, return the per-step metrics rows."""
    from sleuth.training.zero import resolved_dtype

    cfg, rows = train_recipe(model, STEPS, overrides)
    return {"dtype": str(resolved_dtype(cfg.deepspeed)).removeprefix("torch."), "rows": rows,
            "episodes": cfg.rollout.tasks_per_step * cfg.rollout.group_size}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="start model (default: runs/main/sft/hf if present, else smollm2)")
    ap.add_argument("--arm", choices=list(ARMS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    model = args.model or ("runs/main/sft/hf" if Path("runs/main/sft/hf/config.json").exists() else "smollm2")
    if args.arm:
        print(json.dumps(arm(model, ARMS[args.arm])))
        return
    from sleuth.training.zero import cpu_bf16_is_fast

    names = [n for n in ARMS if n != "recipe" or cpu_bf16_is_fast()]
    results = {name: run_arm(__file__, name, ("--model", model)) for name in names}
    lines = [f"Model `{model}`, `configs/docread_cigpo.yaml`, 8 episodes a step; {cpu_name()}. Medians over "
             f"steps 2–{STEPS} (step 1 is a warm-up); each arm in a fresh process."
             + ("" if "recipe" in results else " No AMX-BF16 here: `deepspeed.dtype: auto` is fp32, so the recipe "
                "as configured is the `recipe, fp32` arm."), "",
             "| arm | dtype | CPU s / step | wall s / step | update share of wall | episodes / CPU-min | "
             "ratio vs recipe, fp32 | engine–trainer mean |Δlogp| |",
             "|---|---|---|---|---|---|---|---|"]
    base = None
    for name, res in results.items():
        rows = res["rows"][1:]
        cpu = statistics.median(r["time/step_cpu"] for r in rows)
        wall = statistics.median(sum(r[f"time/{k}"] for k in ("rollout", "reward", "update", "sync")) for r in rows)
        update = statistics.median(r["time/update"] for r in rows)
        mismatch = statistics.median(r["mismatch/mean"] for r in rows)
        rate = res["episodes"] / (cpu / 60)
        base = base or rate
        lines.append(f"| {name} | {res['dtype']} | {cpu:.1f} | {wall:.1f} | {update / wall:.0%} | {rate:.1f} | "
                     f"{rate / base:.2f} | {mismatch:.1e} |")
    publish("recipe_speed", "DocRead RL recipe: episodes per CPU-minute", "\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
