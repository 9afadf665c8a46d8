"""Trainer ranks as Ray actors (`cluster.train_ranks` > 0): `sleuth train` places that many `TrainRank`
actors (one placement group of {CPU: train_cpus, GPU: train_gpus} bundles), and each runs a `Trainer` as one
rank of the DeepSpeed process group, with torch.distributed initialised inside the actor (rank 0's node and a
free port there as the rendezvous), as torchrun would set it up. Rollout and env workers, checkpoints,
metrics and resume are each rank's `Trainer`'s, unchanged.

A rank that dies ends the run: the others are stopped (a collective would wait for the dead one forever)
and the driver says which rank died and that `--resume` continues from the last complete checkpoint. Ranks
are not restarted in place: a restarted rank could not rejoin the process group mid-step."""

from __future__ import annotations

import os
from typing import Any

from sleuth.core.errors import TrainingError
from sleuth.training.cluster.placement import ClusterError, connect, placement, worker_lost
from sleuth.training.config import TrainConfig


class TrainRank:
    """One DeepSpeed rank in a Ray actor process (the process title is `ray::TrainRank`)."""

    def address(self) -> tuple[str, int]:
        """This node's address and a free port on it: the process group's rendezvous when this is rank 0."""
        import ray

        from sleuth.core.net import free_port

        return ray.util.get_node_ip_address(), free_port()

    def pid(self) -> int:
        return os.getpid()

    def train(self, cfg: TrainConfig, resume: bool, rank: int, world: int,
              master: tuple[str, int]) -> tuple[list[dict[str, Any]], int]:
        """(rank 0's metrics rows, the step reached)."""
        os.environ.update(RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE=str(world), MASTER_ADDR=master[0],
                          MASTER_PORT=str(master[1]))  # Ray gives each actor its own GPUs: local rank 0
        from sleuth.training.rl.trainer import Trainer

        trainer = Trainer(cfg, resume=resume, progress=False)
        rows = trainer.train()
        return rows, trainer.step


class RayTrainer:
    """What `sleuth train` runs in the driver when `cluster.train_ranks` > 0: the `Trainer` interface
    (`train()`, `rank`, `step`) over the rank actors."""

    rank = 0

    def __init__(self, cfg: TrainConfig, resume: bool = False):
        if "RANK" in os.environ and os.environ.get("WORLD_SIZE", "1") != "1":
            raise ClusterError("cluster.train_ranks places the ranks as Ray actors: run `sleuth train` as one "
                               "process, not under torchrun or the deepspeed launcher")
        self.cfg, self.resume, self.step = cfg, resume, 0
        c = cfg.cluster
        self.ray, self.started = connect(c)
        self.group: Any = None
        self.actors: list[Any] = []
        try:
            self.group = placement(self.ray, c.train_ranks, {"CPU": c.train_cpus, "GPU": c.train_gpus}, "train ranks")
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            for i in range(c.train_ranks):
                strategy = PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=i)
                self.actors.append(self.ray.remote(TrainRank).options(
                    num_cpus=c.train_cpus, num_gpus=c.train_gpus, max_restarts=0,
                    scheduling_strategy=strategy).remote())
            self.master = self.ray.get(self.actors[0].address.remote())
        except BaseException:
            self.close()
            raise

    def train(self) -> list[dict[str, Any]]:
        from ray.exceptions import RayTaskError

        world = len(self.actors)
        refs = {a.train.remote(self.cfg, self.resume, r, world, self.master): r for r, a in enumerate(self.actors)}
        results: dict[int, tuple[list[dict[str, Any]], int]] = {}
        try:
            pending = list(refs)
            while pending:
                done, pending = self.ray.wait(pending, num_returns=1)
                rank = refs[done[0]]
                try:
                    results[rank] = self.ray.get(done[0])
                except worker_lost() as e:  # killed, crashed, or killed by Ray when the node ran low on memory
                    cause = (str(e).strip().splitlines() or [""])[0]
                    raise TrainingError(f"train rank {rank} died ({cause[:200]}); the other ranks were stopped: "
                                        "rerun with --resume to continue from the last complete checkpoint") from None
                except RayTaskError as e:  # the rank's own error (e.g. every episode failed), as it raised it
                    raise e.cause from None
        finally:
            self.close()
        rows, self.step = results[0]
        return rows

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a, no_restart=True)
        self.actors = []
        if self.group is not None:
            self.ray.util.remove_placement_group(self.group)
            self.group = None
        if self.started:
            self.ray.shutdown()
            self.started = False
