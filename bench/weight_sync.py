"""Seconds per weight sync to Ray rollout workers: the object store (one copy in Ray's shared memory, each worker
loads it) vs the collective transport (a gloo group, the weights broadcast in buckets), side by side in one run.

Run: `.venv/bin/python bench/weight_sync.py [--quick] [--workers 2] [--repeats 3] [--bucket-mb 256]`. Prints a
Markdown report and writes it to runs/bench/weight_sync.md (`--quick`: the tiny random model, writes nothing).

Each arm starts `--workers` rollout workers of the embedded SmolLM2 (fp32) on a local Ray, syncs the same weights
`--repeats` times after one warm-up sync, and reports the median seconds of a whole sync as the trainer sees it
(the trainer's part, the workers' loads and the verified probe) and the bytes of the weights per second of it.
Both arms verify every sync against the trainer's probe logits (within 1e-3): a transport that delivered the
wrong weights would fail here, not report a time."""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
from common import publish

from sleuth.core.args import bounded
from sleuth.core.machine import cpu_name


def measure(model_path: str, transport: str, args: argparse.Namespace) -> dict[str, float]:
    import ray
    from transformers import AutoTokenizer

    from sleuth.agents.chat import ChatRenderer
    from sleuth.agents.policies.models import load_causal_lm
    from sleuth.training.cluster.rollout_engine import RayRollout
    from sleuth.training.config import load_config
    from sleuth.training.run import PROBE

    cfg = load_config(overrides={"cluster.backend": "ray", "cluster.rollout_workers": args.workers,
                                 "cluster.worker_cpus": 2 / args.workers if args.workers > 2 else 1.0,
                                 "update.sync_transport": transport, "update.sync_bucket_mb": args.bucket_mb})
    model = load_causal_lm(model_path, dtype=torch.float32)
    probe = ChatRenderer(AutoTokenizer.from_pretrained(model_path)).prompt_ids(PROBE)
    ray.init(include_dashboard=False, log_to_driver=False, num_cpus=max(2, args.workers))
    rollout = RayRollout(cfg.rollout, cfg.cluster, cfg.update, model_path, torch.float32, probe)
    try:
        rollout.sync(model)  # warm-up: the first sync also loads each worker's code paths
        seconds, diffs = [], []
        for _ in range(args.repeats):
            with torch.no_grad():  # new weights each time, as after an update
                next(model.parameters()).add_(1e-3)
            t0 = time.perf_counter()
            stats = rollout.sync(model)
            seconds.append(time.perf_counter() - t0)
            diffs.append(stats["sync/max_logit_diff"])
    finally:
        rollout.close()
        ray.shutdown()
    size = sum(v.numel() * v.element_size() for v in model.state_dict().values())
    s = statistics.median(seconds)
    return {"seconds": s, "mb": size / 2**20, "mb_per_s": size / 2**20 / s, "max_diff": max(diffs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workers", type=bounded(int, 1), default=2)
    ap.add_argument("--repeats", type=bounded(int, 1), default=3)
    ap.add_argument("--bucket-mb", type=bounded(float, 0.001), default=256.0)
    args = ap.parse_args()
    from sleuth.agents.policies.models import resolve_model, tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model_path = tiny_model(os.path.join(tmp, "model")) if args.quick else resolve_model("smollm2")
        arms = {t: measure(model_path, t, args) for t in ("object_store", "collective")}
    a, b = arms["object_store"], arms["collective"]
    rows = [f"| {t} | {m['seconds']:.3f} | {m['mb_per_s']:.0f} | {m['max_diff']:.1e} |" for t, m in arms.items()]
    report = "\n".join([
        f"{'Tiny model (plumbing check)' if args.quick else 'SmolLM2 fp32'}: {a['mb']:.0f} MB of weights to "
        f"{args.workers} workers, median of {args.repeats} syncs, on {cpu_name()}.", "",
        "| transport | s / sync | MB of weights / s | max logit diff |", "|---|---|---|---|", *rows, "",
        f"collective / object store time: {b['seconds'] / a['seconds']:.2f}x (the collective path needs no shared "
        f"store between the nodes; on one node the object store is shared memory). Bucket: {args.bucket_mb:g} MB."])
    if args.quick:
        print(report)
    else:
        publish("weight_sync", "Weight sync to Ray rollout workers: object store vs collective (gloo)", report)


if __name__ == "__main__":
    main()
