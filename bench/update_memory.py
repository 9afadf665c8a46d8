"""Time and memory of one policy update of SmolLM2-135M on the same real DocRead trajectories, three ways:
sleuth's `PolicyUpdater` on DeepSpeed ZeRO-2 with right-padded micro-batches (grouped longest first so
padding stays small: the usual way), with packed ones (`update.packing`: each micro-batch's sequences as
one row, no padding) and padded with activation checkpointing (`deepspeed.gradient_checkpointing`).

Each arm runs in a fresh process (peak resident memory is per process), the arms alternate, medians of the
repeats; an update is timed after a warm-up update at a learning rate of 1e-9 (the weights, hence the
loss, stay put). Reports s/update, real tokens/s, the positions the forward computed, peak RSS, and the
loss and gradient-norm differences (they should be rounding only).

Run: `.venv/bin/python bench/update_memory.py [--repeats 2] [--micro-batch-tokens 4096] [--episodes 8]`.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import publish, smollm2_update_setup

ARMS = ("padded", "packed", "checkpointed")


def episodes(n: int) -> list:
    """Real DocRead episodes of the train split whose lengths differ: the oracle reads the supporting
    documents, first-k the first three, random three at random, on different questions."""
    import sleuth
    from sleuth.agents.loop.episodes import run_episodes
    from sleuth.agents.policies.load import load_policy
    from sleuth.tasks import load_tasks

    make = lambda: sleuth.make("DocRead-v0", harness="text")  # noqa: E731
    per = -(-n // 3)
    out = []
    for k, name in enumerate(("oracle", "first-k", "random")):
        tasks = load_tasks("hotpotqa:train", limit=per * (k + 1))[per * k:]
        out += list(run_episodes(make, tasks, load_policy(name)))
    return out[:n]


def worker(arm: str, batch: Path, micro_batch_tokens: int) -> dict:
    from sleuth.training.rl.batch import micro_batches

    packed = arm == "packed"
    upd, trajs, advs = smollm2_update_setup(batch, micro_batch_tokens, gradient_checkpointing=arm == "checkpointed",
                                            packing=packed)
    loaded_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    upd.update(trajs, advs)  # warm-up (and the packing check)
    t = time.perf_counter()
    stats = upd.update(trajs, advs)
    seconds = time.perf_counter() - t
    mbs = micro_batches(trajs, advs, 0, micro_batch_tokens, packed=upd.policy.uses_packing(),
                       share=upd.policy.shares_prefix())
    positions = sum(int(b.attention_mask.sum()) if packed else b.input_ids.numel() for b in mbs)
    return {"s": seconds, "tokens": sum(len(t.token_ids()) for t in trajs), "positions": positions,
            "micro_batches": len(mbs), "loss": stats.loss_policy + stats.loss_entropy,
            "grad_norm": stats.grad_norm, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "loaded_rss_mb": loaded_rss, "packing": upd.policy.uses_packing()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--worker", choices=ARMS, help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.batch, args.micro_batch_tokens)))
        return
    if args.repeats < 1 or args.episodes < 2 or args.micro_batch_tokens < 1:
        ap.error("--repeats ≥ 1, --episodes ≥ 2 and --micro-batch-tokens ≥ 1")
    batch = Path(tempfile.mkdtemp()) / "batch.jsonl"
    trajs = episodes(args.episodes)
    batch.write_text("".join(t.to_json() + "\n" for t in trajs))
    lengths = sorted(len(t.token_ids()) for t in trajs)
    runs: dict[str, list[dict]] = {a: [] for a in ARMS}
    for r in range(args.repeats):
        for arm in ARMS if r % 2 == 0 else ARMS[::-1]:  # alternating: the machine's drift hits every arm
            out = subprocess.run([sys.executable, __file__, "--worker", arm, "--batch", str(batch),
                                  "--micro-batch-tokens", str(args.micro_batch_tokens)],
                                 capture_output=True, text=True, check=True)
            runs[arm].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(arm, runs[arm][-1], flush=True)
    med = {a: statistics.median(x["s"] for x in runs[a]) for a in ARMS}
    rss = {a: max(x["rss_mb"] for x in runs[a]) for a in ARMS}
    first = {a: runs[a][0] for a in ARMS}
    lines = [f"Batch: {len(trajs)} real DocRead trajectories (hotpotqa:train; oracle, first-k and random readers), "
             f"{sum(lengths)} tokens, {lengths[0]}–{lengths[-1]} per trajectory; micro-batches of ≤ "
             f"{args.micro_batch_tokens} tokens; PPO loss + entropy bonus, T = 0.8; ZeRO-2, fp32, one process; "
             f"fresh process per arm, alternating, medians of {args.repeats}.", "",
             "| update | micro-batches | positions computed | s / update | real tokens / s | peak RSS MB "
             "(after load) | vs padded |", "|---|---|---|---|---|---|---|"]
    for a in ARMS:
        f = first[a]
        lines.append(f"| {a} | {f['micro_batches']} | {f['positions']} | {med[a]:.2f} | {f['tokens'] / med[a]:.0f} "
                     f"| {rss[a]:.0f} ({f['loaded_rss_mb']:.0f}) | {med[a] / med['padded']:.2f}× time |")
    ref = first["padded"]
    lines += ["", *(f"{a}: |Δ loss| {abs(first[a]['loss'] - ref['loss']):.1e}, |Δ grad norm| "
                    f"{abs(first[a]['grad_norm'] - ref['grad_norm']):.1e} against padded (grad norm "
                    f"{ref['grad_norm']:.4f})." for a in ARMS[1:]),
              f"Packing used: {first['packed']['packing']}."]
    publish("update_memory", "One update: padded, packed, checkpointed (CPU, SmolLM2-135M)", "\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
