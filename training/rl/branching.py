"""Where a step's extra groups start (`branches:`): branches of its own episodes before their last turn
(`branches.answer`) and branches of a scripted demonstrator's episodes before theirs (`branches.demo`). Either
way the env is replayed to the recorded turn (`agents.loop.scheduler.Branch`) and the policy samples on; an env
whose replies differ on replay cannot be branched, and the run stops in one line rather than score another state."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium

from sleuth.agents.loop.episodes import run_episodes
from sleuth.agents.loop.scheduler import Branch
from sleuth.agents.policies.base import Policy, SamplingParams
from sleuth.agents.trajectory import Trajectory
from sleuth.core.errors import ConfigError
from sleuth.tasks.base import Task
from sleuth.training.config import BranchesConfig, RolloutConfig


def branch_points(trajs: Sequence[Trajectory], tasks: dict[str, Task]) -> list[Branch]:
    """Before the last turn of each episode of `trajs` that ended on its own (terminated, not failed, not cut by
    a budget) after two or more turns, one branch group per episode."""
    return [Branch(t, tasks[t.task_id], len(t.turns) - 1, group=f"{t.group}^{i}")
            for i, t in enumerate(trajs) if not t.failed and t.terminated and len(t.turns) > 1]


def demo_points(make_env: Callable[[], gymnasium.Env], tasks: list[Task], demonstrator: Policy, name: str,
                rc: RolloutConfig, env_id: str, label: str) -> list[Branch]:
    """The demonstrator plays each of `tasks` (greedy); a branch group `TASK@label^demo` before the last turn of
    each of its episodes that ended on its own after two or more turns."""
    shown = list(run_episodes(make_env, tasks, demonstrator, SamplingParams(temperature=0.0), rc.concurrency,
                              env_id=env_id, env_threads=rc.env_threads, episode_timeout_s=rc.episode_timeout_s))
    by_id = {t.id: t for t in tasks}
    points = [Branch(b.of, b.task, b.at, group=f"{b.of.task_id}@{label}^demo") for b in branch_points(shown, by_id)]
    if not points and any(not t.failed for t in shown):  # not an infrastructure failure: the demonstrator's own
        raise ConfigError(f"branches.demonstrator {name!r} ended no episode of {env_id} after two or more "
                          "turns: there is no state before its last turn to start from")
    return points


def run_branches(make_env: Callable[[], gymnasium.Env], points: list[Branch], copies: int, policy: Policy,
                 sampling: SamplingParams, rc: RolloutConfig, env_id: str, key: str) -> list[Trajectory]:
    """`copies` continuations of each branch point by the policy; `key` names the option in the error of an env
    that replies otherwise on replay."""
    out = list(run_episodes(make_env, [p for p in points for _ in range(copies)], policy, sampling, rc.concurrency,
                            env_id=env_id, env_threads=rc.env_threads, episode_timeout_s=rc.episode_timeout_s))
    diverged = next((t for t in out if t.stop_reason == "replay_error"), None)
    if diverged is not None:
        raise ConfigError(f"branches.{key}: {diverged.error}; env {env_id} needs branches.{key}: 0")
    return out


def load_demonstrator(bc: BranchesConfig, tokenizer: Any, seed: int) -> Policy:
    """The scripted policy of `branches.demonstrator`, rendering with the policy's tokenizer (its episodes are
    the contexts the policy continues)."""
    from sleuth.agents.policies.load import SCRIPTED_POLICIES
    from sleuth.core.registry import UnknownNameError

    try:
        return SCRIPTED_POLICIES.get(bc.demonstrator)(tokenizer, seed=seed)
    except UnknownNameError as e:
        raise ConfigError(f"branches.demonstrator: {e}") from None


class BranchRounds:
    """A trainer's extra groups of one round: `branches.answer` continuations of each episode that ended on its
    own after two or more turns, from the context before its last turn (a group per episode), and `branches.demo`
    continuations of the demonstrator's episode of each task (a group per task)."""

    def __init__(self, bc: BranchesConfig, rc: RolloutConfig, env_id: str, tokenizer: Any, seed: int):
        self.bc, self.rc, self.env_id = bc, rc, env_id
        self.demonstrator = load_demonstrator(bc, tokenizer, seed) if bc.demo else None

    def answers(self, make_env: Callable[[], gymnasium.Env], trajs: list[Trajectory], tasks: dict[str, Task],
                policy: Policy, sampling: SamplingParams) -> list[Trajectory]:
        points = branch_points(trajs, tasks)
        if not self.bc.answer or not points:
            return []
        return run_branches(make_env, points, self.bc.answer, policy, sampling, self.rc, self.env_id, "answer")

    def demos(self, make_env: Callable[[], gymnasium.Env], tasks: list[Task], policy: Policy,
              sampling: SamplingParams, label: str) -> list[Trajectory]:
        if self.demonstrator is None:
            return []
        points = demo_points(make_env, tasks, self.demonstrator, self.bc.demonstrator, self.rc, self.env_id, label)
        return run_branches(make_env, points, self.bc.demo, policy, sampling, self.rc, self.env_id, "demo")
