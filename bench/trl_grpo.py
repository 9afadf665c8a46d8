"""One GRPO step: sleuth's trainer parts vs TRL's GRPOTrainer, at equal work, side by side in one run.

The work, the same on both sides: SmolLM2-135M-Instruct in fp32 on this machine's CPU threads; 4 HotpotQA
train questions (one user message: the question, "answer in a few words") × a group of 4 = 16
completions of exactly 32 tokens (no early stop on either side) at T = 1; the token F1 of each completion
against the gold answer as its reward; group-standardised advantages; the PPO-clip loss (ε 0.2 / 0.28,
no KL, token-mean over the batch: TRL's `dapo` loss type), one AdamW step at lr 1e-6 with grad clip 1.0.
sleuth: `TransformersPolicy` (the rollout engine `sleuth train` builds here: in this process, running the
trainer's own module, reused prefixes on), `grpo` advantages, `PolicyUpdater` on DeepSpeed (ZeRO-2, `sleuth
train`'s default, and ZeRO-0; packed rows with a group's prompt laid out once, and, as a third arm, without
that), then the weight sync (nothing to copy: the engine runs the updated module). TRL: `GRPOTrainer`
(generation with the training model itself, so it has no sync either).

Activation checkpointing: TRL's `GRPOConfig` turns it on by default (`gradient_checkpointing=True`), sleuth's
`deepspeed.gradient_checkpointing` is off by default. The arms above run each side's default; one more sleuth arm
(ZeRO-0) turns it on, the like-for-like comparison of memory.

Two more arms at the other precision each side offers: TRL with `bf16=True` (on the CPU, HF's Trainer keeps
fp32 weights and runs under bf16 autocast) and sleuth ZeRO-0 with `deepspeed.dtype: bf16` (bf16 weights with
fp32 masters, the rollout engine in bf16; what `auto` picks on a CPU with AMX-BF16). They are compared
with each other, and run only on a CPU with AMX-BF16 (where `deepspeed.dtype: auto` picks bf16): elsewhere
bf16 matmuls are emulated, hundreds of times slower, and nobody would train that way.

Each arm runs in a fresh process (peak memory is per arm): a warm-up step, then 3 measured steps; wall and
CPU seconds per step are the medians. Run: `.venv/bin/python bench/trl_grpo.py` (part of `make bench`).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time

from common import publish, run_arm, trl_step_clock

from sleuth.core.machine import cpu_name

PROMPTS, GROUP, TOKENS, STEPS, LR = 4, 4, 32, 3, 1e-6
# each sleuth arm: deepspeed.zero_stage, update.share_prefix, deepspeed.dtype, deepspeed.gradient_checkpointing
SLEUTH_ARMS = {
    "sleuth-zero2": (2, True, "fp32", False), "sleuth-zero0": (0, True, "fp32", False),
    "sleuth-zero2-unshared": (2, False, "fp32", False), "sleuth-zero0-ckpt": (0, True, "fp32", True),
    "sleuth-zero0-bf16": (0, True, "bf16", False),
}
ARMS = ("trl", "sleuth-zero2", "sleuth-zero0", "sleuth-zero2-unshared", "sleuth-zero0-ckpt", "trl-bf16",
        "sleuth-zero0-bf16")


def questions() -> list[tuple[str, str, list[str]]]:
    from sleuth.tasks import load_tasks

    out = []
    for t in load_tasks("hotpotqa:train", limit=PROMPTS * (STEPS + 1)):
        out.append((t.id, f"{t.question}\nAnswer in a few words.", [t.answer, *t.aliases]))
    return out


def reward(text: str, answers: list[str]) -> float:
    from sleuth.verifiers import token_f1

    return max(token_f1(text, a) for a in answers)


def sleuth_arm(zero_stage: int, share_prefix: bool, dtype: str, checkpointing: bool) -> dict[str, float]:
    import numpy as np
    from transformers import AutoTokenizer

    from sleuth import rewards
    from sleuth.agents.policies.base import Request, SamplingParams
    from sleuth.agents.policies.models import load_causal_lm, resolve_model
    from sleuth.agents.trajectory import Trajectory, Turn
    from sleuth.training.cluster.placement import ClusterConfig
    from sleuth.training.config import RolloutConfig
    from sleuth.training.rl.losses import LossConfig
    from sleuth.training.rl.update import PolicyUpdater, UpdateConfig
    from sleuth.training.rollout.factory import make_rollout
    from sleuth.training.zero import DeepSpeedConfig, build_engine, init_distributed

    init_distributed()
    path = resolve_model("smollm2")
    engine_cfg = DeepSpeedConfig(zero_stage=zero_stage, lr=LR, dtype=dtype, gradient_checkpointing=checkpointing)
    engine = build_engine(load_causal_lm(path), engine_cfg)
    tok = AutoTokenizer.from_pretrained(path)
    probe = tok.apply_chat_template([{"role": "user", "content": "Hello"}], add_generation_prompt=True,
                                    return_dict=False)
    update_cfg = UpdateConfig(micro_batch_tokens=1 << 20, share_prefix=share_prefix)
    # the engine `sleuth train` builds for these settings: in this process, running the trainer's own module
    rollout = make_rollout(RolloutConfig(concurrency=PROMPTS * GROUP), ClusterConfig(), update_cfg, engine_cfg,
                           engine.module, path, engine.module.dtype, probe)
    rollout.policy.stop_ids = [-1]  # no stop token: every completion is exactly TOKENS long, as on TRL's side
    updater = PolicyUpdater(engine, update_cfg, LossConfig(), tok.pad_token_id or 0)
    grpo = rewards.make("grpo")
    qs = questions()
    walls, cpus = [], []
    for step in range(STEPS + 1):
        w, c = time.perf_counter(), time.process_time()
        batch = qs[step * PROMPTS:(step + 1) * PROMPTS]
        reqs, trajs = [], []
        for _, text, _ in batch:
            ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                          return_dict=False)
            reqs += [Request(prompt_ids=list(ids), messages=[], task=None)] * GROUP
        gens = rollout.policy.generate(reqs, SamplingParams(temperature=1.0, max_tokens=TOKENS, seed=step))
        for k, g in enumerate(gens):
            tid, _, answers = batch[k // GROUP]
            trajs.append(Trajectory(task_id=tid, env_id="bench", prompt_ids=reqs[k].prompt_ids, group=tid,
                                    turns=[Turn(g.ids, g.logprobs, g.text)], reward=reward(g.text, answers)))
        advantages = grpo(trajs, {}).values
        updater.update(trajs, [np.asarray(a) for a in advantages])
        rollout.sync(engine.module)
        if step:  # the first step warms up
            walls.append(time.perf_counter() - w)
            cpus.append(time.process_time() - c)
    return {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus),
            "tokens": sum(len(g.ids) for g in gens)}


def trl_arm(bf16: bool = False) -> dict[str, float]:
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from sleuth.agents.policies.models import load_causal_lm, resolve_model

    path = resolve_model("smollm2")
    qs = questions()
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": text}], "answers": answers}
                              for _, text, answers in qs])

    def f1(completions, answers, **_):
        return [reward(c[0]["content"], a) for c, a in zip(completions, answers, strict=True)]

    clock = trl_step_clock()
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(output_dir=out, use_cpu=True, bf16=bf16, per_device_train_batch_size=PROMPTS * GROUP,
                          num_generations=GROUP, max_completion_length=TOKENS,
                          generation_kwargs={"min_new_tokens": TOKENS}, temperature=1.0, top_p=1.0,
                          learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
                          max_grad_norm=1.0, beta=0.0, epsilon=0.2, epsilon_high=0.28, loss_type="dapo",
                          max_steps=STEPS + 1, logging_steps=1, save_strategy="no", report_to="none",
                          shuffle_dataset=False, seed=0, dataloader_num_workers=0)
        trainer = GRPOTrainer(model=load_causal_lm(path), reward_funcs=f1, args=args,
                              train_dataset=data, processing_class=AutoTokenizer.from_pretrained(path),
                              callbacks=[clock])
        trainer.train()
        lengths = [r["completions/mean_length"] for r in trainer.state.log_history if "completions/mean_length" in r]
    return {"wall_s": statistics.median(clock.walls[1:]), "cpu_s": statistics.median(clock.cpus[1:]),
            "tokens": (lengths[-1] if lengths else float("nan")) * PROMPTS * GROUP}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arm", choices=ARMS)
    a = ap.parse_args()
    if a.arm:
        bf16 = a.arm.endswith("-bf16")
        result = trl_arm(bf16) if a.arm.startswith("trl") else sleuth_arm(*SLEUTH_ARMS[a.arm])
        result["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(json.dumps(result))
        return
    from sleuth.training.zero import cpu_bf16_is_fast

    arms = [arm for arm in ARMS if cpu_bf16_is_fast() or not arm.endswith("-bf16")]
    results = {arm: run_arm(__file__, arm) for arm in arms}
    rows = ["| arm | wall s / step | CPU s / step | vs TRL (CPU s) | completion tokens / step | peak RSS GB | "
            "vs TRL (RSS) |", "|---|---|---|---|---|---|---|"]
    names = {"trl": "TRL GRPOTrainer (its defaults: gradient checkpointing on)",
             "sleuth-zero2": "sleuth, ZeRO-2 (default)", "sleuth-zero0": "sleuth, ZeRO-0",
             "sleuth-zero2-unshared":
                 "sleuth, ZeRO-2, each member's prompt in the update (`update.share_prefix: false`)",
             "sleuth-zero0-ckpt": "sleuth, ZeRO-0, `deepspeed.gradient_checkpointing: true` (TRL's default is on)",
             "trl-bf16": "TRL GRPOTrainer, `bf16=True` (on the CPU: fp32 weights, bf16 autocast)",
             "sleuth-zero0-bf16": "sleuth, ZeRO-0, `deepspeed.dtype: bf16` (bf16 weights, fp32 masters)"}
    for arm, r in results.items():
        base = results["trl-bf16" if arm.endswith("-bf16") else "trl"]
        rows.append(f"| {names[arm]} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['cpu_s'] / base['cpu_s']:.2f}× | "
                    f"{r['tokens']:.0f} | {r['peak_rss_gb']:.2f} | {r['peak_rss_gb'] / base['peak_rss_gb']:.2f}× |")
    publish("trl_grpo", "One GRPO step: sleuth vs TRL's GRPOTrainer",
            f"{PROMPTS} prompts × {GROUP} completions × {TOKENS} tokens, SmolLM2 on the CPU, medians of "
            f"{STEPS} steps after a warm-up, each arm in a fresh process; {cpu_name()}; "
            + ("bf16 arms against TRL's bf16, the others against its fp32" if cpu_bf16_is_fast() else
               "no AMX-BF16 here, so no bf16 arms (emulated bf16 is hundreds of times slower)")
            + ":\n\n" + "\n".join(rows))


if __name__ == "__main__":
    main()
