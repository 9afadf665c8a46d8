"""Rollouts produced while the trainer updates: asynchronous training with bounded staleness.

A producer thread runs the continuous agent loop over an endless feed of task groups; the trainer takes
complete groups step by step. The feed issues a step's groups only while fewer than `max_staleness`
steps' worth are issued and not yet taken: a step issued while the trainer updates (its version one
behind) is taken `max_staleness` versions later at most. With 1, the next step samples while this one
trains (one-step off-policy). An episode in flight across a weight update goes on with the new weights
(a partial rollout): its turns carry the versions that produced them, and the loss uses each turn's own sampling
logprobs (`Turn.action_logprobs`) for the behaviour-policy correction (`loss.rollout_is`). When a group is taken,
its staleness is the current version minus the oldest version of any of its turns; a group staler than
`max_staleness` is dropped whole (a GRPO group is trained only complete) and counted. A group with a failed
episode (`Trajectory.failed`) is handed back apart (`Taken.failed`), whatever its age: it never trains, and
the trainer records it. Its task is issued once more at once, ahead of new tasks (`Taken.reissued`), and that
group takes the failed one's place in the step, as the synchronous loop re-samples it: an outage of an env
server that fails every episode in flight costs their groups one more try, not the run."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import gymnasium

from sleuth.agents.loop.episodes import run_episodes
from sleuth.agents.loop.scheduler import TaskFeed
from sleuth.agents.policies.base import Policy, SamplingParams
from sleuth.agents.policies.requests import WeightsGate
from sleuth.agents.trajectory import Trajectory
from sleuth.tasks.base import Task


@dataclass
class StreamStats:
    """What one take from the stream measured (the step's metrics gather these from every rank)."""

    dropped: int  # trajectories of groups dropped as staler than the bound
    staleness: list[int]  # per kept trajectory: current version − the oldest version among its turns
    partial: int  # kept trajectories whose turns came from more than one version


@dataclass
class Taken:
    trajs: list[Trajectory]  # the kept groups' trajectories, group after group
    stats: StreamStats
    failed: list[Trajectory] = field(default_factory=list)  # the groups with a failed episode, group after group
    reissued: int = 0  # of those, groups whose task was issued once more (their second try is in this take or later)


@dataclass
class _Group:
    trajs: list[Trajectory] = field(default_factory=list)
    retry: bool = False  # the second try of a group that failed: not re-issued again


def staleness(traj: Trajectory, version: int) -> int:
    return version - min((t.policy_version for t in traj.turns), default=version)


class _GroupFeed(TaskFeed):
    """Issues each step's tasks `group_size` times, while at most `ahead` steps are issued and not taken."""

    def __init__(self, stream: RolloutStream):
        self.s = stream
        self._pending: deque[Task] = deque()  # tasks of the step being issued

    def poll(self, n: int) -> list[Task] | None:
        s = self.s
        with s.cond:
            if s.stopped:
                return None
            if not self._pending and s.issued_steps - s.taken_steps < s.ahead:
                tasks = s.next_tasks()
                s.untaken.append([t.id for t in tasks])
                for task in tasks:
                    s.open.setdefault(task.id, deque()).append(_Group())
                    s.tasks[task.id] = task
                    self._pending.extend([task] * s.group_size)
                s.issued_steps += 1
            return [self._pending.popleft() for _ in range(min(n, len(self._pending)))]

    def again(self, task: Task) -> None:
        """Issue `task`'s group once more, ahead of what is pending (under the stream's lock)."""
        self._pending.extendleft([task] * self.s.group_size)

    def wait(self, timeout_s: float) -> None:
        with self.s.cond:
            self.s.cond.wait(timeout_s)


class RolloutStream:
    def __init__(self, make_env: Callable[[], gymnasium.Env], next_tasks: Callable[[], list[Task]], policy: Policy,
                 sampling: SamplingParams, *, group_size: int, concurrency: int, max_staleness: int, env_id: str = "",
                 env_threads: int = 0, gate: WeightsGate | None = None, episode_timeout_s: float | None = None):
        if max_staleness < 1:
            raise ValueError(f"a rollout stream needs max_staleness ≥ 1 (0 is the synchronous loop), "
                             f"got {max_staleness}")
        self.next_tasks, self.group_size, self.max_staleness = next_tasks, group_size, max_staleness
        self.ahead = max_staleness
        self.cond = threading.Condition()
        self.open: dict[str, deque[_Group]] = {}  # per task id, its groups being filled, oldest first
        self.tasks: dict[str, Task] = {}  # every task issued, by id (to issue a failed group's again)
        self.ready: deque[list[Trajectory]] = deque()
        self.failed_once: list[list[Trajectory]] = []  # failed groups whose task was issued again, not yet taken
        self.untaken: deque[list[str]] = deque()  # the task ids of each step issued and not yet taken, oldest first
        self.feed = _GroupFeed(self)
        self.issued_steps, self.taken_steps, self.stopped, self._serial = 0, 0, False, 0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._produce, name="sleuth-rollout-stream", daemon=True, args=(
            make_env, policy, sampling, concurrency, env_id, env_threads, gate, episode_timeout_s))
        self._thread.start()

    def _produce(self, make_env, policy, sampling, concurrency, env_id, env_threads, gate, episode_timeout_s) -> None:
        try:
            for traj in run_episodes(make_env, self.feed, policy, sampling, concurrency, env_id,
                                     env_threads=env_threads, gate=gate, episode_timeout_s=episode_timeout_s):
                with self.cond:
                    groups = self.open[traj.task_id]
                    group = groups[0]  # members of a task's groups are alike: the oldest open group fills first
                    group.trajs.append(traj)
                    if len(group.trajs) < self.group_size:
                        continue
                    groups.popleft()
                    for t in group.trajs:  # one label per group: the estimators group by it
                        t.group = f"{t.task_id}#{self._serial}"
                    self._serial += 1
                    if any(t.failed for t in group.trajs) and not group.retry:
                        self.failed_once.append(group.trajs)
                        groups.append(_Group(retry=True))
                        self.feed.again(self.tasks[traj.task_id])
                        continue
                    self.ready.append(group.trajs)
                    self.cond.notify_all()
        except BaseException as e:  # handed to the trainer at its next take
            with self.cond:
                self.error = e
                self.cond.notify_all()

    def take(self, n_groups: int, version: int, timeout_s: float = 3600.0) -> Taken:
        """`n_groups` complete groups (waiting for them), those within the staleness bound of `version`
        kept and those with a failed episode set apart; taking one step's worth lets the feed release the
        next step's tasks."""
        kept: list[Trajectory] = []
        failed: list[Trajectory] = []
        stale: list[int] = []
        dropped = partial = got = 0
        with self.cond:
            while got < n_groups:
                if not self.cond.wait_for(lambda: self.ready or self.error, timeout_s):
                    raise TimeoutError(f"no complete rollout group within {timeout_s:g} s")
                if self.error is not None:
                    raise RuntimeError(f"the rollout stream failed: "
                                       f"{type(self.error).__name__}: {self.error}") from self.error
                group = self.ready.popleft()
                got += 1
                if any(t.failed for t in group):
                    failed += group
                    continue
                ages = [staleness(t, version) for t in group]
                if max(ages) > self.max_staleness:
                    dropped += len(group)
                    continue
                kept += group
                stale += ages
                partial += sum(len({turn.policy_version for turn in t.turns}) > 1 for t in group)
            reissued = len(self.failed_once)  # their second tries are in this take, or come in a later one
            failed += [t for group in self.failed_once for t in group]
            self.failed_once.clear()
            self.taken_steps += 1
            self.untaken.popleft()
            self.cond.notify_all()
        return Taken(kept, StreamStats(dropped, stale, partial), failed, reissued)

    def issued_ahead(self) -> list[list[str]]:
        """The task ids of the steps issued and not yet taken, oldest first: what a checkpoint taken now records, so
        that a resumed run issues them again first instead of skipping them."""
        with self.cond:
            return [list(step) for step in self.untaken]

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop issuing tasks; the episodes in flight end on their own (the thread is a daemon)."""
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        self._thread.join(timeout_s)
