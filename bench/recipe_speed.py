"""DocRead episodes per CPU-minute of `make run`'s RL recipe, side by side in one run.

Each arm trains `configs/docread_cigpo.yaml` (CIGPO, 2 tasks × a group of 4 = 8 episodes a step, SmolLM2)
from the same model, seeds and tasks, for a warm-up step and 3 measured steps, each in a fresh process;
the figure is episodes / CPU-minute of the whole step (rollout, reward, update, sync: `time/step_cpu`),
median over the measured steps, plus wall seconds, the update's share and the engine–trainer logprob
mismatch (bf16 rounds the engine's incremental decoding and the trainer's packed forward apart).

Arms:
- `switches off`: the levers turned off, as the loop ran when DocRead steps took 100–180 CPU s for 8
  episodes: ZeRO-2, fp32, the head over every position (full logits, then a tempered copy), generation in
  lock-step rounds, every member's prompt prefilled, no KV kept across turns, right-padded micro-batches
  (no packing, so no shared prompt in the update). Two differences remain, both in this arm's favour:
  DeepSpeed's shm op is not built at set-up in one process (a run's cost, not a step's), and AdamW runs
  fused (no switch; under ZeRO-2 it steps one flat partition, where fusing saves least).
- `recipe, fp32`: the recipe as a CPU without AMX-BF16 runs it.
- `recipe`: the recipe as configured (`deepspeed.dtype: auto`: bf16 where the CPU has AMX-BF16); on a CPU
  without it `auto` is fp32, the same run as `recipe, fp32`, so this arm is left out there (the report says so).

Run: `.venv/bin/python bench/recipe_speed.py [--model DIR]` (default: the warm start `runs/main/sft/hf`
that `make run` writes, else SmolLM2 itself; the warm start's episodes are the ones RL trains on).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from common import cpu_name, publish, run_arm, train_recipe

STEPS = 4  # the first is a warm-up
ARMS = {
    "switches off": {"deepspeed.zero_stage": 2, "deepspeed.dtype": "fp32", "update.packing": False,
                     "rollout.kv_keep_mb": 0},  # and `levers_off()`
    "recipe, fp32": {"deepspeed.dtype": "fp32"},
    "recipe": {},
    # LoRA on every linear layer of the body: no weight gradients or optimizer states for the frozen
    # weights, but adapters in every forward and a merge at every sync (a speed arm: not tuned to learn)
    "recipe + LoRA r 16": {"deepspeed.lora": {"r": 16, "alpha": 32, "target_modules": [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}},
}


def levers_off() -> None:
    """The levers that are no config key, turned off in this process: the update's head over every position
    (`ScoredForward(full_logits=True)`), every member's prompt prefilled (`TransformersPolicy(share_prefill=
    False)`), generation in lock-step rounds (`run_episodes(lockstep=True)`)."""
    import functools

    from sleuth.agents.loop import episodes as loop
    from sleuth.agents.policies import hf
    from sleuth.training.rl import forward

    def forcing(fn, **forced):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            return fn(*args, **{**kwargs, **forced})
        return call

    forward.ScoredForward.__init__ = forcing(forward.ScoredForward.__init__, full_logits=True)
    hf.TransformersPolicy.__init__ = forcing(hf.TransformersPolicy.__init__, share_prefill=False)
    loop.run_episodes = forcing(loop.run_episodes, lockstep=True)


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
        if args.arm == "switches off":
            levers_off()
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
             "ratio vs switches off | engine–trainer mean |Δlogp| |",
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
