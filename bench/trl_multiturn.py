"""Multi-turn GRPO on a tool env: sleuth's trainer vs TRL's GRPOTrainer and its own tool loop, side by side.

The work, the same on both sides: DocRead (HotpotQA train questions, 10 paragraphs, `read` and `answer` tools, 3
reads at most) played by SmolLM2-135M-Instruct in fp32 on this machine's CPU threads, with the chat template TRL
ships for Qwen2.5 (SmolLM2's own renders no tools, and TRL refuses it for tool calling) and its
`<tool_call>{json}</tool_call>` format, which sleuth's `template` harness reads too. So that the model calls the
tools at all, both sides start from one warm start: `sleuth sft` on 60 scripted oracle episodes in that format
(cached in ~/.cache/sleuth/bench; a few minutes, once). Per step 2 questions × a group of 4 episodes at T = 1;
the reward is the env's verifier (token F1 of the answer); group-standardised advantages; PPO-clip (ε 0.2 /
0.28), token mean, no KL; one AdamW step at lr 1e-6, grad clip 1.0. sleuth: `Trainer` as `sleuth train` runs it
(the continuous agent loop with KV states kept across an episode's turns, packing; the engine runs the trainer's
own module) with the shipped 2-core recipes' engine settings (ZeRO-0, 2,048 tokens a forward/backward), 64 tokens
a turn. TRL's `GRPOConfig` turns activation checkpointing on by default, sleuth's is off: `--sleuth-set
deepspeed.gradient_checkpointing=true` compares memory like for like. TRL:
`GRPOTrainer(environment_factory=...)` with sleuth's env as its tool class (`sleuth.envs.outbound.trl`), 4
tool-calling iterations, a 1,024-token completion budget (tool results count in it), generation by the training
model (TRL's default without vLLM).

Each arm runs in a fresh process: a warm-up step, then measured steps. What each side generates differs with
its samples (TRL also generates a turn after the `answer` tool's result, where sleuth's episode has ended), so
the comparison is per generated (policy) token, and turns per episode are reported beside it. Run:
`.venv/bin/python bench/trl_multiturn.py` (part of `make bench`); `--repeat 2` measures each arm twice.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import publish, run_arm, trl_step_clock

from sleuth.core.machine import cpu_name

TASKS_PER_STEP, GROUP, TURN_TOKENS, READS, STEPS, LR = 2, 4, 64, 3, 2, 1e-6
COMPLETION_BUDGET = 1024
WARM_DIR = Path(os.environ.get("SLEUTH_CACHE", Path.home() / ".cache" / "sleuth")) / "bench" / "trl_multiturn"
TASKS = "hotpotqa:train[100:]"  # past the warm start's 60 questions
ARMS = ("trl", "sleuth")


def qwen_template() -> str:
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()


def warm_start() -> Path:
    """SmolLM2 with TRL's Qwen2.5 tool-calling template, taught the tool format by SFT on oracle episodes."""
    hf = WARM_DIR / "sft" / "hf"
    if (hf / "config.json").exists():
        return hf
    from transformers import AutoTokenizer

    from sleuth.agents.policies.models import load_causal_lm, resolve_model

    base = WARM_DIR / "base"
    src = resolve_model("smollm2")
    tok = AutoTokenizer.from_pretrained(src)
    tok.chat_template = qwen_template()
    load_causal_lm(src).save_pretrained(base)
    tok.save_pretrained(base)
    config = WARM_DIR / "sft.yaml"
    config.write_text(json.dumps({
        "model": str(base), "out": str(WARM_DIR / "sft"), "seed": 0, "epochs": 2, "batch_size": 4,
        "micro_batch_tokens": 4096,
        "data": {"source": "oracle", "demonstrator": "oracle", "tasks": "hotpotqa:train", "task_limit": 60,
                 "env": "DocRead-v0", "env_args": {"harness": "template"}},
        "deepspeed": {"zero_stage": 0, "lr": 5e-5}, "checkpoint": {"every": 0, "export_hf": True}}))
    print(f"warm start: sleuth sft on oracle episodes → {hf} (once)", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "sleuth.cli", "sft", "--config", str(config)], check=True)
    return hf


def sleuth_arm(model: Path, overrides: dict[str, str]) -> dict[str, float]:
    from sleuth.agents.eval.episodes import load_trajectories
    from sleuth.training.config import load_config
    from sleuth.training.rl.trainer import Trainer

    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(overrides={
            "model": str(model), "out": out, "env": "DocRead-v0", "env_args": {"harness": "template"},
            "tasks": TASKS, "task_limit": 200, "max_steps": STEPS + 1,
            "rollout.tasks_per_step": TASKS_PER_STEP, "rollout.group_size": GROUP, "rollout.max_tokens": TURN_TOKENS,
            "rollout.temperature": 1.0, "loss.eps_low": 0.2, "loss.eps_high": 0.28, "loss.aggregation": "token_mean",
            # as the shipped 2-core recipes (configs/docread_quick.yaml): ZeRO-0 (one process: ZeRO partitions
            # nothing) and 2,048 tokens a forward/backward
            "deepspeed.zero_stage": 0, "update.micro_batch_tokens": 2048,
            "deepspeed.lr": LR, "deepspeed.dtype": "fp32", "checkpoint.every": 0, "checkpoint.export_hf": False,
            "tensorboard": False, **overrides})
        rows = Trainer(cfg, progress=False).train()[1:]  # the first step warms up
        trajs = [t for s in range(2, STEPS + 2)
                 for t in load_trajectories(Path(out) / "rollouts" / f"step-{s:06d}.rank0.jsonl")]
    walls = [sum(r[f"time/{k}"] for k in ("rollout", "reward", "update", "sync")) for r in rows]
    tokens = sum(t.num_policy_tokens for t in trajs) / STEPS
    return {"wall_s": statistics.median(walls), "cpu_s": statistics.median(r["time/step_cpu"] for r in rows),
            "policy_tokens": tokens, "episodes": len(trajs) / STEPS,
            "turns": sum(len(t.turns) for t in trajs) / len(trajs),
            "reward": sum(t.reward for t in trajs) / len(trajs),
            "generate_s": statistics.median(r["time/rollout"] for r in rows),
            "update_s": statistics.median(r["time/update"] for r in rows),
            "sync_s": statistics.median(r["time/sync"] for r in rows)}


def trl_arm(model: Path) -> dict[str, float]:
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from sleuth.agents.policies.models import load_causal_lm
    from sleuth.envs.outbound.trl import environment_factory, task_dataset
    from sleuth.tasks import load_tasks

    tasks = load_tasks(TASKS, limit=200)
    DocRead = environment_factory("sleuth/DocRead-v0", tasks, harness="template")

    class Timed(GRPOTrainer):
        """GRPOTrainer with the seconds of its generation (the tool loop included) and what it generated."""

        gen_walls: list[float] = []
        gen_tokens: list[float] = []

        def _generate_and_score_completions(self, inputs):
            t0 = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            self.gen_walls.append(time.perf_counter() - t0)
            mask = out["completion_mask"] * out["tool_mask"] if "tool_mask" in out else out["completion_mask"]
            self.gen_tokens.append(float(mask.sum()))
            return out

    clock = trl_step_clock()
    tok = AutoTokenizer.from_pretrained(model)
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(output_dir=out, use_cpu=True, bf16=False, per_device_train_batch_size=TASKS_PER_STEP * GROUP,
                          num_generations=GROUP, max_completion_length=COMPLETION_BUDGET,
                          max_tool_calling_iterations=READS + 1, temperature=1.0, top_p=1.0, learning_rate=LR,
                          lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, beta=0.0,
                          epsilon=0.2, epsilon_high=0.28, loss_type="dapo", max_steps=STEPS + 1, logging_steps=1,
                          save_strategy="no", report_to="none", shuffle_dataset=False, seed=0,
                          dataloader_num_workers=0)
        trainer = Timed(model=load_causal_lm(model), processing_class=tok, args=args,
                        train_dataset=task_dataset(DocRead), environment_factory=DocRead, callbacks=[clock])
        trainer.train()
        logs = trainer.state.log_history
    calls = [r["tools/call_frequency"] for r in logs if "tools/call_frequency" in r][1:]
    rewards = [v for r in logs for k, v in r.items() if k.startswith("rewards/") and k.endswith("/mean")][1:]
    failures = [r["tools/failure_frequency"] for r in logs if "tools/failure_frequency" in r][1:]
    return {"wall_s": statistics.median(clock.walls[1:]), "cpu_s": statistics.median(clock.cpus[1:]),
            "policy_tokens": statistics.mean(Timed.gen_tokens[1:]), "episodes": TASKS_PER_STEP * GROUP,
            "turns": 1 + statistics.mean(calls) if calls else float("nan"),
            "reward": statistics.mean(rewards) if rewards else float("nan"),
            "tool_failures": statistics.mean(failures) if failures else float("nan"),
            "generate_s": statistics.median(Timed.gen_walls[1:]),
            "update_s": statistics.median(clock.walls[1:]) - statistics.median(Timed.gen_walls[1:]), "sync_s": 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arm", choices=ARMS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each arm (the spread between them is reported)")
    ap.add_argument("--sleuth-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a training setting of the sleuth arm (e.g. update.micro_batch_tokens=2048), reported")
    ap.add_argument("--arms", default=",".join(ARMS), help="the arms to run (default both)")
    a = ap.parse_args()
    import yaml

    sets = {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in a.sleuth_set)}  # values as `--set` reads them
    if a.arm:
        result = trl_arm(Path(a.model)) if a.arm == "trl" else sleuth_arm(Path(a.model), sets)
        result["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(json.dumps(result))
        return
    model = warm_start()
    arms = [x for x in a.arms.split(",") if x]
    runs = {arm: [] for arm in arms}
    arm_sets = [x for kv in a.sleuth_set for x in ("--sleuth-set", kv)]
    for k in range(a.repeat):
        for arm in arms:
            runs[arm].append(run_arm(__file__, arm, ("--model", str(model), *arm_sets),
                                     env={"TRL_EXPERIMENTAL_SILENCE": "1"}))
            print(f"run {k + 1} {arm}: {json.dumps(runs[arm][-1])}", file=sys.stderr, flush=True)
    rows = ["| run | arm | wall s / step | CPU s / step | policy tokens / step | turns / episode | CPU ms / token "
            "| vs TRL (CPU / token) | generation s | update s | sync s | peak RSS GB | mean reward |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    if "trl" not in runs:
        print(json.dumps(runs))
        return
    for k in range(a.repeat):
        base = runs["trl"][k]
        base_per = base["cpu_s"] / base["policy_tokens"]
        for arm in arms:
            r = runs[arm][k]
            per = r["cpu_s"] / r["policy_tokens"]
            rows.append(f"| {k + 1} | {'TRL GRPOTrainer, its tool loop' if arm == 'trl' else 'sleuth Trainer'} | "
                        f"{r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['policy_tokens']:.0f} | {r['turns']:.2f} | "
                        f"{1000 * per:.1f} | {per / base_per:.2f}× | {r['generate_s']:.1f} | {r['update_s']:.1f} | "
                        f"{r['sync_s']:.1f} | {r['peak_rss_gb']:.2f} ({r['peak_rss_gb'] / base['peak_rss_gb']:.2f}×) "
                        f"| {r['reward']:.3f} |")
    publish("trl_multiturn", "Multi-turn GRPO on DocRead: sleuth vs TRL's GRPOTrainer tool loop",
            f"{TASKS_PER_STEP} questions × {GROUP} episodes a step, ≤ {READS} reads + an answer, SmolLM2 (warm "
            f"start in TRL's Qwen2.5 tool format) fp32 on the CPU, medians of {STEPS} steps after a warm-up, each "
            f"arm in a fresh process, {a.repeat} runs; {cpu_name()}"
            + (f"; sleuth arm with {', '.join(a.sleuth_set)}" if a.sleuth_set else "")
            + ". TRL's 'generation s' is its `_generate_and_score_completions` (the tool loop, rewards), "
            "'update s' the rest of its step:\n\n"
            + "\n".join(rows))


if __name__ == "__main__":
    main()
