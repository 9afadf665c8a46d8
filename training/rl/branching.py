"""Where a step's extra groups start: branches of its own episodes before their last turn (`rollout.branches`)
and branches of a scripted demonstrator's episodes before theirs (`rollout.demo_branches`). Either way the env
is replayed to the recorded turn (`agents.scheduler.Branch`) and the policy samples on; an env whose replies
differ on replay cannot be branched, and the run stops in one line rather than score another state."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium

from sleuth.agents.loop.episodes import run_episodes
from sleuth.agents.loop.scheduler import Branch
from sleuth.agents.policies.base import Policy, SamplingParams
from sleuth.agents.trajectory import Trajectory
from sleuth.tasks.base import Task
from sleuth.training.config import ConfigError, RolloutConfig


def branch_points(trajs: Sequence[Trajectory], tasks: dict[str, Task]) -> list[Branch]:
    """Before the last turn of each episode of `trajs` that ended on its own (terminated, not failed, not cut by
    a budget) after two or more turns, one branch group per episode."""
    return [Branch(t, tasks[t.task_id], len(t.turns) - 1, group=f"{t.group}^{i}")
            for i, t in enumerate(trajs) if not t.failed and t.terminated and len(t.turns) > 1]


def demo_points(make_env: Callable[[], gymnasium.Env], tasks: list[Task], demonstrator: Policy,
                rc: RolloutConfig, env_id: str, label: str) -> list[Branch]:
    """The demonstrator plays each of `tasks` (greedy); a branch group `TASK@label^demo` before the last turn of
    each of its episodes that ended on its own after two or more turns."""
    shown = list(run_episodes(make_env, tasks, demonstrator, SamplingParams(temperature=0.0), rc.concurrency,
                              env_id=env_id, env_workers=rc.env_workers, episode_timeout_s=rc.episode_timeout_s))
    by_id = {t.id: t for t in tasks}
    points = [Branch(b.of, b.task, b.at, group=f"{b.of.task_id}@{label}^demo") for b in branch_points(shown, by_id)]
    if not points and any(not t.failed for t in shown):  # not an infrastructure failure: the demonstrator's own
        raise ConfigError(f"rollout.demonstrator {rc.demonstrator!r} ended no episode of {env_id} after two or more "
                          "turns: there is no state before its last turn to start from")
    return points


def run_branches(make_env: Callable[[], gymnasium.Env], points: list[Branch], copies: int, policy: Policy,
                 sampling: SamplingParams, rc: RolloutConfig, env_id: str, key: str) -> list[Trajectory]:
    """`copies` continuations of each branch point by the policy; `key` names the option in the error of an env
    that replies otherwise on replay."""
    out = list(run_episodes(make_env, [p for p in points for _ in range(copies)], policy, sampling, rc.concurrency,
                            env_id=env_id, env_workers=rc.env_workers, episode_timeout_s=rc.episode_timeout_s))
    diverged = next((t for t in out if t.stop_reason == "replay_error"), None)
    if diverged is not None:
        raise ConfigError(f"rollout.{key}: {diverged.error}; env {env_id} needs rollout.{key}: 0")
    return out


def load_demonstrator(rc: RolloutConfig, tokenizer: Any, seed: int) -> Policy:
    """The scripted policy of `rollout.demonstrator`, rendering with the policy's tokenizer (its episodes are
    the contexts the policy continues)."""
    from sleuth.agents.policies.load import SCRIPTED_POLICIES
    from sleuth.core.registry import UnknownNameError

    try:
        return SCRIPTED_POLICIES.get(rc.demonstrator)(tokenizer, seed=seed)
    except UnknownNameError as e:
        raise ConfigError(f"rollout.demonstrator: {e}") from None
