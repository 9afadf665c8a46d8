"""Run by `torchrun --nproc_per_node 2` from test_training_engine: two ZeRO-2 updates on a fixed batch split
across two ranks, then ZeRO-3 with PPO epochs and mini-batches on an uneven split (one rank has empty
mini-batches: its collectives must still line up; the first mini-batch holds data on both ranks, the plain
ZeRO-3 update's case); rank 0 writes the surrogate objective before/after as JSON."""

import json
import sys

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from train_helpers import fixed_batch, surrogate  # noqa: E402

from sleuth.training.rl.losses import LossConfig  # noqa: E402
from sleuth.training.rl.update import PolicyUpdater, UpdateConfig  # noqa: E402
from sleuth.training.zero import DeepSpeedConfig, build_engine, init_distributed  # noqa: E402


def main(model_dir: str, out: str) -> None:
    rank, world = init_distributed()
    trajs, advs = fixed_batch(8)
    mine = (trajs[rank::world], advs[rank::world])
    result = {"world": world}
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    engine = build_engine(model, DeepSpeedConfig(zero_stage=2, lr=1e-3, dtype="fp32"))
    updater = PolicyUpdater(engine, UpdateConfig(micro_batch_tokens=64), LossConfig(), pad_id=0)
    before = surrogate(engine.module, trajs, advs)
    for _ in range(2):  # the second step reads the moments the first left in the partitioned optimizer state
        stats = updater.update(*mine)
    after = surrogate(engine.module, trajs, advs)
    result["zero2"] = {"before": before, "after": after, "grad_norm": stats.grad_norm}
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    engine = build_engine(model, DeepSpeedConfig(zero_stage=3, lr=1e-3, dtype="fp32"))
    ppo = UpdateConfig(micro_batch_tokens=64, epochs=2, mini_batches=3)
    updater = PolicyUpdater(engine, ppo, LossConfig(), pad_id=0)
    uneven = (trajs[:3], advs[:3]) if rank == 0 else (trajs[3:4], advs[3:4])
    before = surrogate(engine.module, trajs[:4], advs[:4])
    stats = updater.update(*uneven)
    steps = [None] * world
    dist.all_gather_object(steps, stats.optimizer_steps)
    result["zero3_ppo"] = {"before": before, "after": surrogate(engine.module, trajs[:4], advs[:4]), "steps": steps}
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
