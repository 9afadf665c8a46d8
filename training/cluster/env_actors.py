"""Envs in Ray actors (`cluster.env_actors` > 0): slow envs (SWE tests, code sandboxes, retrieval) run on
CPU nodes away from the trainer's accelerators.

Each `EnvWorker` actor holds env sessions (one env object each, built with `sleuth.make(env, **env_args)` in
the actor); the agent loop in the training process sees `RayEnv`s, gymnasium envs that forward `reset` and
`step` to their session. Sessions are spread over the workers round robin. Steps are blocking calls: set
`rollout.env_actors` (threads) so env steps overlap with generation.

A worker whose process dies is restarted by Ray, but the sessions it held are gone: an episode that was running
there fails as an env failure (`env_error`: never scored, its group leaves the update), and the `RayEnv` opens a
new session on the restarted worker at its next `reset`. Restarts are counted (`cluster/env_restarts`); a worker
that dies more than `cluster.max_restarts` times within `cluster.restart_window_s` is crash-looping: stopped for
the run, and new sessions go to the other workers."""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any

import gymnasium

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

RESTART_WAIT_S = 120.0  # how long a reset waits for a restarting env worker
CLOSE_WAIT_S = 30.0  # how long closing a session waits for its worker (a session stuck in a step may never close)
# Calls an env worker runs at once (a threaded actor): a session stuck in a step must not hold up the others,
# nor the close that tears it down. Envs already step concurrently in `rollout.env_actors` threads.
SESSION_THREADS = 32


class EnvWorker:
    """Env sessions in a Ray actor process (the process title is `ray::EnvWorker`)."""

    def __init__(self, env_id: str, env_args: dict[str, Any]):
        self.env_id, self.env_args = env_id, env_args
        self.sessions: dict[int, gymnasium.Env] = {}
        self.ids = itertools.count()

    def pid(self) -> int:
        return os.getpid()

    def open(self) -> tuple[int, int]:
        """A new session: (its id, this process's pid)."""
        import sleuth

        sid = next(self.ids)
        self.sessions[sid] = sleuth.make(self.env_id, **self.env_args)
        return sid, os.getpid()

    def reset(self, sid: int, seed: int | None, options: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
        return self.sessions[sid].reset(seed=seed, options=options)

    def step(self, sid: int, action: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        return self.sessions[sid].step(action)

    def close(self, sid: int) -> None:
        env = self.sessions.pop(sid, None)
        if env is not None:
            env.close()


class EnvPool:
    """`cluster.env_actors` EnvWorker actors in one placement group; `make()` is the env factory the agent
    loop uses."""

    def __init__(self, cluster: ClusterConfig, env_id: str, env_args: dict[str, Any], start_timeout_s: float = 300.0):
        from ray.exceptions import GetTimeoutError, RayActorError
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.cluster = cluster
        self.ray, self.started = connect(cluster)
        self.group: Any = None
        self.actors: list[Any] = []
        self.pids: list[int] = []
        self.loops = [CrashLoop(cluster.max_restarts, cluster.restart_window_s) for _ in range(cluster.env_actors)]
        self.stopped: dict[int, str] = {}  # worker index → why it is dead for the run
        self.restarts = 0
        self._next = itertools.count()
        self._lock = threading.RLock()  # `opened` stops a crash-looping worker while holding it
        try:
            self.group = placement(self.ray, cluster.env_actors, {"CPU": cluster.env_actor_cpus}, "env workers")
            for i in range(cluster.env_actors):
                strategy = PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=i)
                self.actors.append(self.ray.remote(EnvWorker).options(
                    num_cpus=cluster.env_actor_cpus, max_restarts=RAY_RESTARTS, max_task_retries=0,
                    max_concurrency=SESSION_THREADS, scheduling_strategy=strategy).remote(env_id, dict(env_args)))
            self.pids = self.ray.get([a.pid.remote() for a in self.actors], timeout=start_timeout_s)
        except (GetTimeoutError, RayActorError) as e:
            self.close()
            raise ClusterError(f"the env workers did not start: {str(e).strip().splitlines()[-1]}") from None
        except BaseException:
            self.close()
            raise

    def make(self) -> RayEnv:
        """A session on the next live worker (round robin); on a stopped one when none is left, whose episodes
        then fail with the reason."""
        for _ in range(len(self.actors)):
            index = next(self._next) % len(self.actors)
            if index not in self.stopped:
                break
        return RayEnv(self, index)

    def opened(self, index: int, pid: int) -> None:
        """A session was opened on worker `index` in process `pid`: a new pid there is a restart (one too many
        within the window stops the worker: `RayEnvError`)."""
        with self._lock:
            if pid != self.pids[index]:
                self.pids[index] = pid
                self.restarts += 1
                if self.loops[index].died():
                    self.stop(index, self.loops[index].verdict(f"env worker {index}"))
            if index in self.stopped:
                raise RayEnvError(self.stopped[index])

    def stop(self, index: int, why: str) -> None:
        """Worker `index` is dead for the run (Ray restarts it no more); new sessions go to the others."""
        with self._lock:
            self.stopped.setdefault(index, why)
            self.ray.kill(self.actors[index], no_restart=True)

    def stats(self) -> dict[str, float]:
        return {"cluster/env_restarts": float(self.restarts),
                "cluster/live_env_actors": float(len(self.actors) - len(self.stopped))}

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a, no_restart=True)
        if self.group is not None:
            self.ray.util.remove_placement_group(self.group)
        if self.started:
            self.ray.shutdown()


class RayEnvError(InfraFailure):
    """The env worker holding this session died (or cannot be reached): the episode fails as an env failure."""


class RayEnv(gymnasium.Env):
    """An env whose session lives in an `EnvWorker`."""

    metadata = {"render_modes": []}

    def __init__(self, pool: EnvPool, index: int):
        self.pool, self.index, self.actor = pool, index, pool.actors[index]
        self.sid: int | None = None

    def _open(self) -> None:
        if self.index in self.pool.stopped:
            raise RayEnvError(self.pool.stopped[self.index])
        try:
            sid, pid = through_restart(lambda: self.pool.ray.get(self.actor.open.remote()), RESTART_WAIT_S,
                                       f"env worker {self.index}")
        except ActorGone as e:  # stopped, or not back within the wait: either way gone for the run
            self.pool.stop(self.index, str(e))
            raise RayEnvError(str(e)) from None
        self.pool.opened(self.index, pid)
        self.sid = sid

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        if self.sid is None:
            self._open()
        try:
            return self.pool.ray.get(self.actor.reset.remote(self.sid, seed, options))
        except (*worker_lost(), KeyError):  # the worker was restarted since: this session is gone, open another
            self._open()
            return self.pool.ray.get(self.actor.reset.remote(self.sid, seed, options))

    def step(self, action: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        try:
            return self.pool.ray.get(self.actor.step.remote(self.sid, action))
        except (*worker_lost(), KeyError) as e:
            self.sid = None
            raise RayEnvError(f"env worker {self.index} lost this episode's session ({type(e).__name__}): the "
                              "episode fails and is not scored") from None

    def close(self) -> None:
        from ray.exceptions import GetTimeoutError

        if self.sid is not None:
            try:
                self.pool.ray.get(self.actor.close.remote(self.sid), timeout=CLOSE_WAIT_S)
            except (*worker_lost(), KeyError, GetTimeoutError):
                pass
            self.sid = None
