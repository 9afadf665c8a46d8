"""A step's rollouts on one rank, sorted for the update: which groups train, with which advantages.

A group with a failed episode (`Trajectory.failed`) never trains: its baseline would be over the survivors
only. A group has no learning signal when every advantage the estimator gives its members is 0 — judged on
the advantages, not the outcome rewards, so a group whose members scored alike but read differently still
trains under a step-reward estimator (`info_gain`, `gigpo`, `gear_mix`); `keep_no_signal` says whether
such groups train anyway (`rollout.zero_variance: keep`). Every estimator sleuth ships is group-local, so
advantages taken round by round are the advantages of the whole step. Branch groups (`branches.answer`,
and `branches.demo`: branches of a demonstrator's episodes) are judged alike and counted apart, each
kind in its own `BranchCount`: the zero-variance shares describe the episodes' groups."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from sleuth.agents.eval.rescore import Rescorer
from sleuth.agents.trajectory import Trajectory
from sleuth.rewards.base import Estimator, groups
from sleuth.rewards.episodes import per_episode
from sleuth.tasks.base import Task
from sleuth.training.rl.step_metrics import BranchCount
from sleuth.training.rollout.asynchronous import StreamStats


@dataclass
class Collected:
    estimator: Estimator
    tasks: Mapping[str, Task]  # by id
    keep_no_signal: bool
    kept: list[Trajectory] = field(default_factory=list)  # the trajectories the update trains on
    seen: list[Trajectory] = field(default_factory=list)  # every one sampled, failed ones included
    advantages: list[np.ndarray] = field(default_factory=list)  # aligned with `kept`
    estimator_metrics: dict[str, list[float]] = field(default_factory=dict)  # the estimator's, every round's
    zero_var: Counter = field(default_factory=Counter)  # groups whose outcome rewards are all alike: correct / wrong
    no_signal_groups: int = 0  # groups whose every advantage is 0
    branches: BranchCount = field(default_factory=BranchCount)  # `branches.answer`
    demos: BranchCount = field(default_factory=BranchCount)  # `branches.demo`
    stream: StreamStats | None = None  # what the rollout stream reports (None without one)
    dropped_failed: int = 0  # groups left out because a member failed
    reissued: int = 0  # of those, the tasks sampled once more in the same step
    reward_s: float = 0.0  # seconds spent in the estimator and in scoring episodes again
    rescore: Rescorer | None = None  # the config's `verifier`: each round's episodes scored again, groups whole

    def take(self, trajs: list[Trajectory], demos: bool = False) -> list[Task]:
        """A round's trajectories in (`demos`: branches of a demonstrator's episodes); the tasks of its groups of
        episodes left out for a failed episode."""
        if self.rescore is not None:
            t0 = time.perf_counter()
            trajs = self.rescore(trajs)
            self.reward_s += time.perf_counter() - t0
        self.seen += trajs
        whole, failed = [], []
        for idx in groups(trajs).values():
            if any(trajs[i].failed for i in idx):
                self.dropped_failed += 1
                count = self._count(trajs[idx[0]], demos)
                if count is None:
                    failed.append(self.tasks[trajs[idx[0]].task_id])
                else:  # a branch group is not sampled again: its episode was
                    count.failed += sum(trajs[i].failed for i in idx)
                    count.rewards += [trajs[i].reward for i in idx if not trajs[i].failed]
            else:
                whole.append([trajs[i] for i in idx])
        self._judge(whole, demos)
        return failed

    def _count(self, member: Trajectory, demos: bool) -> BranchCount | None:
        """Where a group of `member`'s kind is counted: None for a group of episodes."""
        return self.demos if demos else self.branches if member.branch_at else None

    def _judge(self, whole: list[list[Trajectory]], demos: bool) -> None:
        """Advantages for a round's intact groups; each group kept unless it has no learning signal and such
        groups are left out."""
        flat = [t for g in whole for t in g]
        if not flat:
            return
        t0 = time.perf_counter()
        est = per_episode(self.estimator, flat, self.tasks)  # an agent's segments: its episode's advantage
        self.reward_s += time.perf_counter() - t0
        for k, v in est.metrics.items():
            self.estimator_metrics.setdefault(k, []).extend(v)
        at = 0
        for members in whole:
            advs = est.values[at:at + len(members)]
            at += len(members)
            rewards = [t.reward for t in members]
            count = self._count(members[0], demos)
            if count is not None:
                count.groups += 1
                count.rewards += rewards
            elif max(rewards) - min(rewards) < 1e-9:
                self.zero_var["correct" if rewards[0] > 0 else "wrong"] += 1
            if not any(np.asarray(a).size and float(np.abs(a).max()) > 1e-9 for a in advs):
                if count is not None:
                    count.no_signal += 1
                else:
                    self.no_signal_groups += 1
                if not self.keep_no_signal:
                    continue
            self.kept += members
            self.advantages += list(advs)
