"""Rollout workers as Ray actors (`cluster.backend: ray`): `cluster.rollout_workers` `RolloutWorker`s, each a
transformers engine in its own process and placement-group bundle, behind the router the vLLM servers use
(`RoutedPolicy`: a task sticks to one worker, so its episodes reuse that worker's KV cache).

Weight sync: the trainer's full weights go into Ray's object store once per update (`ray.put`, shared memory
on the node), every worker loads them and answers with its logits on the probe prompt, which must match the
trainer's within `update.sync_tolerance` (`WeightSyncError` names the worker otherwise, and a worker that
does not answer within `rollout.sync_timeout_s`).

A worker whose process dies (killed, out of memory, node lost) is restarted by Ray in its bundle. The request
that found it dead waits for the restart, the worker is loaded with the current weights and verified, and the
request is sent again: a generation is a pure function of its prompt and the weights, so re-issuing it is
exact. Restarts are counted (`cluster/restarts`). A worker that dies more than `cluster.max_restarts` times
within `cluster.restart_window_s` is crash-looping: stopped and dead for the run; its requests go to the
others, and when none is left the episodes fail as an engine failure (never scored, their groups leave the
update)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Protocol

import torch

from sleuth.agents.policies.base import Generation, Request, SamplingParams
from sleuth.agents.policies.openai_http import ServerUnreachable
from sleuth.agents.policies.routing import RoutedPolicy
from sleuth.core.errors import InfraFailure
from sleuth.training.cluster.placement import (
    RAY_RESTARTS,
    ActorGone,
    ClusterConfig,
    ClusterError,
    CrashLoop,
    connect,
    placement,
    through_restart,
    worker_lost,
)
from sleuth.training.rollout.in_process import WeightSyncError, probe_logits
from sleuth.training.sync.weight_stream import Link, join, receive, send


class Recovery(Protocol):
    """How a restarted worker gets the current weights, where the object store does not hold them
    (`training.sync.ray_collective.CollectiveSync`)."""

    def recover(self, handle: WorkerHandle) -> tuple[int, Any]: ...


GROUP_EXIT_WAIT_S = 30.0  # at the close of a local Ray: how long the workers' process groups get to exit


class StaleWeights(InfraFailure):
    """A worker asked to generate with weights it does not hold (a restarted worker starts from the model on
    disk): the caller loads the current ones first."""


class RolloutWorker:
    """A transformers engine in a Ray actor process (the process title is `ray::RolloutWorker`). It serves
    `generate` only with the weights the driver names (`weights_id`), so a restarted worker never answers
    with the model it was started from."""

    def __init__(self, model_path: str, dtype: str, threads: int, device: str, max_batch: int, kv_keep_mb: int):
        from sleuth.agents.policies.hf import TransformersPolicy

        torch.set_num_threads(max(1, threads))
        self.policy = TransformersPolicy(model_path, device=device, dtype=getattr(torch, dtype), max_batch=max_batch,
                                         kv_keep_mb=kv_keep_mb)
        self.weights_id = 0  # the model on disk

    def pid(self) -> int:
        return os.getpid()

    def load_weights(self, state: dict[str, torch.Tensor] | None, weights_id: int,
                     probe_ids: list[int]) -> tuple[int, torch.Tensor | None]:
        """Load the trainer's full weights (None: keep the model on disk); answer with this process's pid and
        the probe prompt's logits."""
        if state is None:
            return os.getpid(), None
        missing, unexpected = self.policy.model.load_state_dict(state, strict=False)
        if unexpected or [k for k in missing if "lm_head" not in k]:  # lm_head may be tied to the embeddings
            raise WeightSyncError(f"weights do not fit the rollout model: missing {missing[:5]}, "
                                  f"unexpected {unexpected[:5]}")
        self.weights_id = weights_id
        self.policy.version += 1  # a new key for the KV states it keeps: those of the old weights are stale
        return os.getpid(), probe_logits(self.policy.model, probe_ids)

    def receive_weights(self, link: Link, rank: int, world: int, weights_id: int,
                        probe_ids: list[int]) -> tuple[int, torch.Tensor]:
        """Receive weights `weights_id` from rank 0 of `link`'s group (as member `rank` of `world`); answer as
        `load_weights` does."""
        group = join(link.address, link.port, link.prefix, rank, world, link.backend, link.timeout_s)
        try:
            with torch.no_grad():
                receive(group, self.policy.model.state_dict(), link.plan, self._link_device(link))
        except (KeyError, ValueError) as e:
            raise WeightSyncError(f"weights do not fit the rollout model: {e}") from None
        finally:
            group.shutdown()
        self.weights_id = weights_id
        self.policy.version += 1
        return os.getpid(), probe_logits(self.policy.model, probe_ids)

    def send_weights(self, link: Link, world: int) -> int:
        """Broadcast the weights this worker holds as rank 0 of `link`'s group (to a restarted peer); the bytes."""
        group = join(link.address, link.port, link.prefix, 0, world, link.backend, link.timeout_s)
        try:
            return send(group, self.policy.model.state_dict(), link.plan, self._link_device(link))
        finally:
            group.shutdown()

    def _link_device(self, link: Link) -> torch.device:
        return next(self.policy.model.parameters()).device if link.backend == "nccl" else torch.device("cpu")

    def generate(self, requests: list[Request], sampling: SamplingParams, weights_id: int) -> list[Generation]:
        if weights_id != self.weights_id:
            raise StaleWeights(f"asked for weights {weights_id}, holding {self.weights_id}")
        return self.policy.generate(requests, sampling)


class WorkerHandle:
    """One worker as the router sees a server (`ServerPolicy`): a dead worker is waited for (Ray restarts it),
    loaded with the current weights and verified, and the call is sent again; once it is stopped (crash-looping)
    `ServerUnreachable` sends its requests to the other workers."""

    def __init__(self, owner: WorkerPool, index: int, actor: Any, pid: int = 0):
        self.owner, self.index, self.actor, self.pid = owner, index, actor, pid
        self.name = f"rollout-worker-{index}"
        self.tokenizer, self.max_context = owner.tokenizer, owner.max_context
        self.parallel_calls, self.version = 1, 0
        self.restarts, self.epoch, self.dead, self.why = 0, 0, False, ""
        self.crash_loop = CrashLoop(owner.cluster.max_restarts, owner.cluster.restart_window_s)
        self.attempts = owner.cluster.max_restarts + 3  # tries of one call before its requests go to the others
        self.lock = threading.Lock()

    def generate(self, requests: list[Request], sampling: SamplingParams) -> list[Generation]:
        for _ in range(self.attempts):
            if self.dead:
                break
            epoch = self.epoch
            try:
                return self.owner.ray.get(self.actor.generate.remote(requests, sampling, self.owner.weights_id))
            except (*worker_lost(), StaleWeights):
                self.recover(epoch)
        raise self.unreachable()

    def unreachable(self) -> ServerUnreachable:
        """Why this worker's requests go to the others: stopped for the run, or failed every attempt of a call."""
        if self.dead:
            return ServerUnreachable(self.why, permanent=True)
        return ServerUnreachable(f"{self.name} failed {self.attempts} times in a row", permanent=False)

    def stop(self, why: str) -> None:
        """Dead for the run: Ray restarts it no more."""
        self.dead, self.why = True, why
        self.owner.ray.kill(self.actor, no_restart=True)

    def recover(self, epoch: int) -> None:
        """Load the current weights (waiting while Ray restarts the process) and verify them. `epoch` is the
        recovery count the caller saw, so concurrent callers recover once. A new call that finds the actor
        died for good (Ray's `ActorDiedError`) marks it dead."""
        with self.lock:
            if self.dead or self.epoch != epoch:
                return
            try:
                self.loaded(*through_restart(lambda: self.owner.load(self), self.owner.timeout_s, self.name))
            except ActorGone as e:
                if not e.dead:
                    raise WeightSyncError(f"{e} (rollout.sync_timeout_s)") from None
                self.dead, self.why = True, str(e)
                return
            self.epoch += 1

    def started(self) -> None:
        """The worker's process is up (at the pool's start)."""

    def loaded(self, pid: int, logits: torch.Tensor | None) -> float:
        """A load's answer: a new pid is a restart (counted; one too many within the window stops the worker), and
        the logits must match the trainer's."""
        if pid != self.pid:
            self.pid = pid
            self.restarts += 1
            self.owner.count_restart()
            if self.crash_loop.died():
                self.stop(self.crash_loop.verdict(self.name))
                return 0.0
        return self.owner.verify(self, logits)

    def close(self) -> None:
        pass


def gone_or_timeout(pgids: list[int], timeout_s: float) -> None:
    """Wait until the process groups `pgids` (Ray workers lead their own) are empty, up to `timeout_s`: a worker's
    children (a vLLM engine core and its workers) outlive it when Ray shuts down before killing its group."""
    deadline = time.monotonic() + timeout_s
    for pgid in pgids:
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.1)


class WorkerPool:
    """`cluster.rollout_workers` RolloutWorkers in one placement group, behind a `RoutedPolicy` (`policy`).
    Without a sync they serve the model on disk (weights 0); `RayRollout` moves them on with the trainer's."""

    diff_metric = "sync/max_logit_diff"  # what `verify` measures

    def __init__(self, cluster: ClusterConfig, model_path: str, dtype: torch.dtype, max_batch: int = 16,
                 kv_keep_mb: int = 1024, timeout_s: float = 600.0,
                 tolerance: float = 1e-3, probe_ids: list[int] | None = None, start_timeout_s: float = 600.0):
        from transformers import AutoConfig, AutoTokenizer

        self.cluster, self.timeout_s, self.tolerance, self.probe_ids = cluster, timeout_s, tolerance, probe_ids or []
        self.model_path, self.dtype, self.max_batch, self.kv_keep_mb = model_path, dtype, max_batch, kv_keep_mb
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        # the workers' context, as TransformersPolicy reads it: episodes past it end `prompt_too_long` here too
        self.max_context = int(getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", 8192))
        self.ray, self.started = connect(cluster)
        self.group: Any = None
        self.restarts = 0
        self.weights_id = 0  # which weights the workers must hold to generate: 0 is the model on disk
        self.state_ref: Any = None  # the current weights in the object store (None: the model on disk)
        self.expected: torch.Tensor | None = None  # the trainer's probe logits for them
        self.collective: Recovery | None = None  # the collective transport, where the config asks for it
        self._lock = threading.Lock()
        self.handles: list[WorkerHandle] = []
        try:
            self.group = placement(self.ray, cluster.rollout_workers, {"CPU": cluster.worker_cpus,
                                                                       "GPU": cluster.worker_gpus}, "rollout workers")
            self.handles = [self.handle(i, self._actor(i)) for i in range(cluster.rollout_workers)]
            for h, pid in zip(self.handles, self._started(start_timeout_s), strict=True):
                h.pid = pid
                h.started()
        except BaseException:
            self.close()
            raise
        self.policy = RoutedPolicy(self.handles, name=f"ray:{model_path}")

    def worker(self) -> tuple[type, tuple[Any, ...]]:
        """The actor class of a worker and its arguments."""
        c = self.cluster
        return RolloutWorker, (self.model_path, str(self.dtype).removeprefix("torch."), max(1, int(c.worker_cpus)),
                               "cuda" if c.worker_gpus > 0 else "cpu", self.max_batch, self.kv_keep_mb)

    def handle(self, index: int, actor: Any) -> WorkerHandle:
        return WorkerHandle(self, index, actor)

    def _actor(self, index: int) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        c = self.cluster
        cls, args = self.worker()
        return self.ray.remote(cls).options(
            num_cpus=c.worker_cpus, num_gpus=c.worker_gpus, max_restarts=RAY_RESTARTS, max_task_retries=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=index),
        ).remote(*args)

    def _started(self, timeout_s: float) -> list[int]:
        """Every worker's pid once it has loaded the model; ClusterError with the first failure otherwise."""
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            return self.ray.get([h.actor.pid.remote() for h in self.handles], timeout=timeout_s)
        except GetTimeoutError:
            raise ClusterError(f"the rollout workers did not start within {timeout_s:.0f} s") from None
        except RayActorError as e:
            cause = str(e).strip().splitlines()
            raise ClusterError(f"a rollout worker failed to start: {cause[-1] if cause else e}") from None

    def answered(self, refs: dict[Any, WorkerHandle]) -> list[Any]:
        """`refs` (calls to the workers) once every one is done, each holding its answer or its error;
        `WeightSyncError` naming the workers that did not answer within rollout.sync_timeout_s."""
        ready, waiting = self.ray.wait(list(refs), num_returns=len(refs), timeout=self.timeout_s)
        if waiting:
            names = ", ".join(refs[r].name for r in waiting)
            raise WeightSyncError(f"weight sync timed out after {self.timeout_s:.0f} s waiting for {names} "
                                  "(rollout.sync_timeout_s)")
        return ready

    def count_restart(self) -> None:
        with self._lock:
            self.restarts += 1

    def load(self, handle: WorkerHandle) -> tuple[int, torch.Tensor | None]:
        """The current weights into one worker (after a restart); its pid and probe logits back."""
        from ray.exceptions import GetTimeoutError

        if self.collective is not None and self.weights_id:
            return self.collective.recover(handle)

        ref = handle.actor.load_weights.remote(self.state_ref, self.weights_id, self.probe_ids)
        try:
            return self.ray.get(ref, timeout=self.timeout_s)
        except GetTimeoutError:
            raise WeightSyncError(f"{handle.name} did not load the weights within {self.timeout_s:.0f} s "
                                  "(rollout.sync_timeout_s)") from None

    def verify(self, handle: WorkerHandle, logits: torch.Tensor | None) -> float:
        if self.expected is None or logits is None:  # the model on disk: nothing of the trainer's to match
            return 0.0
        diff = float((self.expected - logits).abs().max())
        if not diff <= self.tolerance:
            raise WeightSyncError(f"after sync {handle.name}'s probe logits differ from the trainer's by {diff:.3g} "
                                  f"(> {self.tolerance}): it is not running the new weights")
        return diff

    def live(self) -> int:
        return sum(not h.dead for h in self.handles)

    def all_dead(self) -> WeightSyncError:
        """The error of a sync that finds no live worker, with each one's cause."""
        return WeightSyncError("every rollout worker is dead: " + "; ".join(h.why for h in self.handles))

    def close(self) -> None:
        if not getattr(self, "ray", None):
            return
        for h in self.handles:
            self.ray.kill(h.actor, no_restart=True)
        if self.group is not None:
            self.ray.util.remove_placement_group(self.group)
        if self.started:  # Ray on this node: its raylet kills each dead worker's process group, if it lives on
            gone_or_timeout([h.pid for h in self.handles if h.pid], GROUP_EXIT_WAIT_S)
            self.ray.shutdown()
