"""The `RolloutEngine` of `cluster.backend: ray`: rollout workers (transformers, `training.cluster.rollout_workers`,
or vLLM servers, `training.cluster.vllm_workers`) and the verified weight sync, through Ray's object store or a
collective group (`update.sync_transport`, `training.sync.ray_collective`)."""

from __future__ import annotations

import torch

from sleuth.training.cluster.placement import ClusterConfig, ClusterError, worker_lost
from sleuth.training.cluster.rollout_workers import WorkerPool
from sleuth.training.config import RolloutConfig
from sleuth.training.rl.update import UpdateConfig
from sleuth.training.rollout.in_process import probe_logits
from sleuth.training.zero import full_state_dict


class RayRollout:
    """The `RolloutEngine` of `cluster.backend: ray`: a `WorkerPool` and the verified weight sync, through the object
    store or a collective group (`update.sync_transport`)."""

    def __init__(self, rc: RolloutConfig, cluster: ClusterConfig, update: UpdateConfig, model_path: str,
                 dtype: torch.dtype, probe_ids: list[int], world: int = 1):
        import ray

        if world > 1 and cluster.address is None and not ray.is_initialized():  # a TrainRank actor is in Ray
            raise ClusterError("several training ranks share one Ray cluster: start it (`ray start --head`) and set "
                               "cluster.address: auto")
        if rc.inference == "vllm":
            from sleuth.training.cluster.vllm_workers import VLLMPool
            from sleuth.training.rollout.vllm_servers import default_vllm_python

            python = rc.vllm_python or default_vllm_python()
            if not python:
                raise FileNotFoundError("rollout.inference=vllm needs a Python with vLLM on the workers' nodes: set "
                                        "rollout.vllm_python or $SLEUTH_VLLM_PYTHON (`make vllm` builds .venv-vllm)")
            self.pool: WorkerPool = VLLMPool(cluster, model_path, dtype, rc.concurrency, rc.kv_keep_mb,
                                             rc.sync_timeout_s, update.sync_tolerance_vllm, probe_ids,
                                             python=python, vllm_args=list(rc.vllm_args))
        else:
            self.pool = WorkerPool(cluster, model_path, dtype, rc.concurrency, rc.kv_keep_mb, rc.sync_timeout_s,
                                   update.sync_tolerance, probe_ids)
        if update.sync_transport == "collective":
            from sleuth.training.sync.ray_collective import CollectiveSync

            # one rank, synchronous: the trainer's weights do not move during rollouts, so it may resend them
            self.pool.collective = CollectiveSync(self.pool, update.sync_bucket_mb,
                                                  trainer_is_source=world == 1 and rc.max_staleness == 0)
        self.policy = self.pool.policy

    def sync(self, module: torch.nn.Module) -> dict[str, float]:
        """The trainer's weights to every live worker, verified; a worker that died since the last call is
        found here too (its pid changed, or it dies during the load) and counted."""
        pool = self.pool
        stats = pool.collective.sync(module) if pool.collective is not None else self._through_object_store(module)
        self.policy.version += 1
        return {**stats, "cluster/restarts": float(pool.restarts), "cluster/live_workers": float(pool.live())}

    def _through_object_store(self, module: torch.nn.Module) -> dict[str, float]:

        pool = self.pool
        pool.expected = probe_logits(module, pool.probe_ids)
        # in host memory: the object store holds CPU tensors, and a worker may have no GPU
        pool.state_ref = pool.ray.put({k: v.cpu() for k, v in full_state_dict(module).items()})
        pool.weights_id += 1
        live = [h for h in pool.handles if not h.dead]
        if not live:
            raise pool.all_dead()
        refs = {h.actor.load_weights.remote(pool.state_ref, pool.weights_id, pool.probe_ids): h for h in live}
        diffs = []
        for ref in pool.answered(refs):
            handle = refs[ref]
            try:
                diffs.append(handle.loaded(*pool.ray.get(ref)))
            except worker_lost():  # died during the sync: its next call waits for the restart and loads then
                pass
        return {pool.diff_metric: max(diffs, default=0.0)}

    def close(self) -> None:
        self.pool.close()
