"""Where a training run's rollout workers live: `local` (in the training process) or `ray` (Ray actors
placed on a cluster, restarted when they die).

With `backend: ray`, `sleuth train` connects to a Ray cluster (`address`: "auto" for a running one, a
`ray://host:port` URL, or None to start a local one), reserves one placement-group bundle per rollout
worker ({"CPU": worker_cpus, "GPU": worker_gpus}) and starts a `RolloutWorker` actor in each
(`training.cluster.rollout_workers`). A worker whose process dies is restarted by Ray in its bundle; one that dies more
than `max_restarts` times within `restart_window_s` seconds is crash-looping and stopped for the run
(`CrashLoop`). With `env_actors` > 0 the envs run in `EnvWorker` actors too (`training.cluster.env_actors`), away from
the trainer. The trainer runs in the driver process (one DeepSpeed rank, or
`torchrun` ranks each with their own workers), or, with `train_ranks` > 0, as that many `TrainRank` actors
(`training.cluster.train_ranks`), each with its own workers."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sleuth.core.errors import InfraFailure

T = TypeVar("T")
RESTART_POLL_S = 0.25  # how often a call asks again for an actor Ray is restarting

BACKENDS = ("local", "ray")


@dataclass
class ClusterConfig:
    backend: str = "local"  # local | ray
    address: str | None = None  # ray: "auto", "ray://host:port", or null (left out) to start a local cluster
    rollout_workers: int = 1  # ray: RolloutWorker actors per training rank, behind one router
    worker_cpus: float = 1.0  # ray: CPUs reserved per worker (its torch threads)
    worker_gpus: float = 0.0  # ray: GPUs reserved per worker
    max_restarts: int = 3  # ray: deaths of a worker within restart_window_s it survives; one more stops it
    restart_window_s: float = 600.0  # ray: the window of max_restarts (deaths further apart never add up)
    env_actors: int = 0  # ray: EnvWorker actors holding the envs (0: envs run in the training process)
    env_actor_cpus: float = 1.0  # ray: CPUs reserved per env worker
    train_ranks: int = 0  # ray: DeepSpeed ranks as TrainRank actors (0: the trainer runs in this process)
    train_cpus: float = 1.0  # ray: CPUs reserved per train rank
    train_gpus: float = 0.0  # ray: GPUs reserved per train rank

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"cluster.backend must be one of {', '.join(BACKENDS)}; got {self.backend!r}")
        for key, value, low in (("rollout_workers", self.rollout_workers, 1), ("worker_cpus", self.worker_cpus, 0),
                                ("worker_gpus", self.worker_gpus, 0), ("max_restarts", self.max_restarts, 0),
                                ("env_actors", self.env_actors, 0), ("env_actor_cpus", self.env_actor_cpus, 0),
                                ("train_ranks", self.train_ranks, 0), ("train_cpus", self.train_cpus, 0),
                                ("train_gpus", self.train_gpus, 0)):
            if not value >= low:  # also refuses NaN
                raise ValueError(f"cluster.{key} must be ≥ {low}, got {value}")
        if not self.restart_window_s > 0:
            raise ValueError(f"cluster.restart_window_s must be > 0, got {self.restart_window_s}")
        if self.backend == "local" and (self.address is not None or self.rollout_workers != 1 or self.env_actors
                                        or self.train_ranks):
            raise ValueError("cluster.address, rollout_workers, env_actors and train_ranks place Ray actors: set "
                             "cluster.backend: ray")


class ClusterError(InfraFailure):
    """Ray cannot be reached or cannot place the workers: one line that says what to change."""


def connect(cfg: ClusterConfig) -> tuple[Any, bool]:
    """(the `ray` module, whether this call started Ray). A running Ray in this process is reused."""
    try:
        import ray
    except ImportError:
        raise ClusterError("cluster.backend: ray needs Ray: pip install 'sleuth[ray]'") from None
    if ray.is_initialized():
        return ray, False
    try:
        ray.init(address=cfg.address, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    except ConnectionError as e:
        raise ClusterError(f"cannot reach the Ray cluster at cluster.address {cfg.address!r}: {e}") from None
    return ray, True


def placement(ray: Any, n: int, bundle: dict[str, float], what: str, timeout_s: float = 120.0) -> Any:
    """A placement group of `n` bundles for `what` (e.g. "rollout workers"), ready; ClusterError when the
    cluster cannot hold it within `timeout_s`."""
    from ray.util.placement_group import placement_group

    bundle = {k: v for k, v in bundle.items() if v}
    pg = placement_group([dict(bundle) for _ in range(n)], strategy="PACK")
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        ray.util.remove_placement_group(pg)
        raise ClusterError(f"the Ray cluster cannot place {n} {what} of {bundle} within {timeout_s:.0f} s "
                           f"(resources: {ray.cluster_resources()}): lower their number or their CPUs / GPUs in "
                           "`cluster`, or add nodes")
    return pg


RAY_RESTARTS = -1  # Ray restarts a dead worker without end: `CrashLoop` decides when a worker is stopped


class CrashLoop:
    """One worker's deaths: more than `limit` within any `window_s` seconds is a crash loop. Ray's own
    `max_restarts` counts over the actor's whole life, so a run of days would end on deaths hours apart, each
    recovered; deaths further apart than the window never add up here."""

    def __init__(self, limit: int, window_s: float, clock: Callable[[], float] = time.monotonic):
        self.limit, self.window_s, self.clock = limit, window_s, clock
        self.deaths: deque[float] = deque()

    def died(self) -> bool:
        """Count a death now; whether the worker is crash-looping (and is to be stopped)."""
        now = self.clock()
        while self.deaths and now - self.deaths[0] >= self.window_s:
            self.deaths.popleft()
        self.deaths.append(now)
        return len(self.deaths) > self.limit

    def verdict(self, name: str) -> str:
        return f"{name} is crash-looping: it died {len(self.deaths)} times within {self.window_s:g} s " \
               "(cluster.max_restarts, cluster.restart_window_s)"


def worker_lost() -> tuple[type[BaseException], ...]:
    """Ray's errors for a call whose actor process died: killed or crashed (`RayActorError`), killed by Ray's memory
    monitor when the node ran low on memory (`OutOfMemoryError`), a worker that crashed (`WorkerCrashedError`). Ray
    restarts the actor in each case."""
    from ray.exceptions import OutOfMemoryError, RayActorError, WorkerCrashedError

    return RayActorError, OutOfMemoryError, WorkerCrashedError


class ActorGone(InfraFailure):
    """The actor died for good (`dead`: stopped, or its node is gone), or did not come back within the wait."""

    def __init__(self, message: str, dead: bool):
        super().__init__(message)
        self.dead = dead


def through_restart(call: Callable[[], T], timeout_s: float, name: str) -> T:
    """`call()` (a `ray.get` on one actor), asked again while Ray restarts that actor's process (Ray's
    `ActorUnavailableError`), up to `timeout_s`; `ActorGone` when it died for good (`ActorDiedError` on a
    new call: stopped, or Ray cannot restart it) or stayed away."""
    from ray.exceptions import ActorDiedError, ActorUnavailableError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except ActorDiedError:
            raise ActorGone(f"{name} is dead (stopped, or Ray cannot restart it)", dead=True) from None
        except ActorUnavailableError:
            if time.monotonic() > deadline:
                raise ActorGone(f"{name} did not come back within {timeout_s:.0f} s", dead=False) from None
            time.sleep(RESTART_POLL_S)
