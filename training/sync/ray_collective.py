"""The collective weight sync of Ray rollout workers (`update.sync_transport: collective`; the transport itself is
`training.sync.weight_stream`).

A sync: every live worker is asked to receive, the trainer joins as rank 0 of a new generation of the group and
broadcasts its weights bucket by bucket, and each worker answers with its probe logits, verified as with the
object store. A worker that dies during the sync breaks that generation: the trainer aborts its member (which
ends the others' waits), and the sync is made again with the workers still alive; the dead one is loaded when
Ray has restarted it.

A restarted worker (found on its next request) gets the current weights from a live peer that holds them (a
two-member group, the peer sending), else from the trainer when its weights cannot have moved since the sync
(one training rank, synchronous training: `trainer_is_source`). Else it waits for the next sync:
`ServerUnreachable` sends its requests to the other workers meanwhile (with none left, the episode fails as an
engine failure: never scored, its group re-sampled)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from sleuth.agents.policies.openai_http import ServerUnreachable
from sleuth.training.cluster.placement import worker_lost
from sleuth.training.rollout.in_process import WeightSyncError, probe_logits
from sleuth.training.sync.weight_stream import Bucket, Link, Rendezvous, bucket_plan, join, plan_bytes, send
from sleuth.training.zero import full_weights

if TYPE_CHECKING:  # the pool holds this object: importing its module at run time would import this one back
    from sleuth.training.cluster.rollout_workers import WorkerHandle, WorkerPool

SYNC_ATTEMPTS = 3  # a sync made again after a worker died during it, with those still alive


class CollectiveSync:
    def __init__(self, pool: WorkerPool, bucket_mb: float, trainer_is_source: bool):
        import ray

        self.pool, self.bucket_bytes, self.trainer_is_source = pool, int(bucket_mb * 2**20), trainer_is_source
        # NCCL needs each rank on a GPU of its own: a worker with a whole GPU (Ray gives whole GPUs to one actor),
        # the trainer on CUDA. A fractional share may be the trainer's own GPU: gloo, through host memory.
        gpu = pool.cluster.worker_gpus >= 1 and torch.cuda.is_available()
        self.backend = "nccl" if gpu else "gloo"
        self.rendezvous = Rendezvous(ray.util.get_node_ip_address(), pool.timeout_s)
        self.module: torch.nn.Module | None = None  # the trainer's, as of the last sync
        self.plan: list[Bucket] = []  # the buckets of the last sync (names, shapes, dtypes: the same every sync)
        self.held: dict[int, int] = {}  # worker index: the weights id it was last verified with
        self._lock = threading.Lock()  # one generation of the group at a time

    def link(self, plan: list[Bucket]) -> Link:
        return Link(self.rendezvous.address, self.rendezvous.port, self.rendezvous.next_prefix(), self.backend,
                    self.pool.timeout_s, plan)

    def _device(self, module: torch.nn.Module) -> torch.device:
        return next(module.parameters()).device if self.backend == "nccl" else torch.device("cpu")

    def sync(self, module: torch.nn.Module) -> dict[str, float]:
        """The trainer's weights to every live worker; stats of the last attempt."""
        from ray.exceptions import RayError

        pool = self.pool
        self.module = module
        pool.expected = probe_logits(module, pool.probe_ids)
        pool.weights_id += 1
        diffs: list[float] = []
        for attempt in range(SYNC_ATTEMPTS):
            live = self._answering([h for h in pool.handles if not h.dead])
            if not live:
                raise pool.all_dead()
            t0 = time.perf_counter()
            with self._lock, full_weights(module) as weights:
                plan = self.plan = bucket_plan(weights, self.bucket_bytes)
                link = self.link(plan)
                refs = {h.actor.receive_weights.remote(link, i + 1, len(live) + 1, pool.weights_id, pool.probe_ids): h
                        for i, h in enumerate(live)}
                broken = self._broadcast(link, len(live) + 1, weights, plan)
            seconds = time.perf_counter() - t0
            diffs = []
            for ref in pool.answered(refs):
                handle = refs[ref]
                try:
                    answer = pool.ray.get(ref)
                except worker_lost():  # died during the sync: loaded when Ray has restarted it
                    continue
                except RayError as e:  # failed in the group: because another member died, or on its own
                    if broken:
                        continue
                    raise WeightSyncError(f"{handle.name} failed to receive the weights: {e}") from None
                diffs.append(handle.loaded(*answer))  # the probe must match the trainer's
                self.held[handle.index] = pool.weights_id
            if not broken:
                break
            if attempt == SYNC_ATTEMPTS - 1:
                raise WeightSyncError(f"weight sync failed {SYNC_ATTEMPTS} times, the last: {broken}")
        return {pool.diff_metric: max(diffs, default=0.0), "sync/seconds": seconds,
                "sync/bytes_per_s": plan_bytes(plan) / max(seconds, 1e-9)}

    def _answering(self, handles: list[WorkerHandle]) -> list[WorkerHandle]:
        """Those of `handles` whose process answers now: a worker that died is left to be restarted and loaded on
        its next request (a member that never joins would hold the group until rollout.sync_timeout_s); one that
        does not answer within rollout.sync_timeout_s fails the sync by name."""
        refs = {h.actor.pid.remote(): h for h in handles}
        out = []
        for ref in self.pool.answered(refs):
            try:
                self.pool.ray.get(ref)
            except Exception:  # noqa: BLE001 (Ray's errors for a dead or restarting actor: not a member now)
                continue
            out.append(refs[ref])
        return sorted(out, key=lambda h: h.index)

    def _broadcast(self, link: Link, world: int, weights: dict[str, torch.Tensor], plan: list[Bucket]) -> str | None:
        """The trainer's part as rank 0; None when it went through, else why it broke (a member died: the
        group is aborted so the others stop waiting)."""
        try:
            group = join(link.address, link.port, link.prefix, 0, world, link.backend, link.timeout_s,
                         store=self.rendezvous.store)
        except RuntimeError as e:  # a member never joined within rollout.sync_timeout_s
            return _first_line(e)
        try:
            send(group, weights, plan, self._device(self.module))
        except RuntimeError as e:  # gloo / NCCL: a peer's connection closed, or the wait timed out
            group.abort()
            return _first_line(e)
        group.shutdown()
        return None

    def recover(self, handle: WorkerHandle) -> tuple[int, torch.Tensor | None]:
        """The current weights into a restarted worker: from a live peer holding them, else from the trainer where
        its weights cannot have moved; `ServerUnreachable` (try another worker) when neither can."""
        pool = self.pool
        pid = pool.ray.get(handle.actor.pid.remote(), timeout=pool.timeout_s)  # up (else Ray's error: retried)
        peers = [h for h in pool.handles
                 if h is not handle and not h.dead and self.held.get(h.index) == pool.weights_id]
        for peer in peers:
            answer = self._pair(handle, lambda link, peer=peer: peer.actor.send_weights.remote(link, 2))
            if answer is not None:
                return answer
        if self.trainer_is_source and self.module is not None:
            def from_trainer(link: Link) -> None:
                with full_weights(self.module) as weights:
                    self._broadcast(link, 2, weights, link.plan)

            answer = self._pair(handle, from_trainer)
            if answer is not None:
                return answer
        raise ServerUnreachable(f"{handle.name} (pid {pid}) restarted and no peer holds the current weights: it "
                                "serves again after the next sync", permanent=False)

    def _pair(self, handle: WorkerHandle, source: Callable[[Link], Any]) -> tuple[int, torch.Tensor] | None:
        """`handle` receives from `source(link)` (a peer's send, or the trainer's broadcast run here) in a group of
        two; its answer, or None when the source failed."""
        from ray.exceptions import RayError

        pool = self.pool
        with self._lock:
            link = self.link(self.plan)
            ref = handle.actor.receive_weights.remote(link, 1, 2, pool.weights_id, pool.probe_ids)
            sent = source(link)
            try:
                if sent is not None:  # a peer's send: its failure means try another source
                    pool.ray.get(sent, timeout=pool.timeout_s)
                answer = pool.ray.get(ref, timeout=pool.timeout_s)
            except (RayError, RuntimeError):
                return None
        self.held[handle.index] = pool.weights_id
        return answer


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
