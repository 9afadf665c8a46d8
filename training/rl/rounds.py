"""A step's rounds of episodes: each task's group under its own key, and the sampling seed of each kind of group,
so a step samples the same way whichever rank, round or retry it is (the trainer's rollout side)."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium

from sleuth.agents.loop.episodes import run_episodes
from sleuth.agents.policies.base import Policy, SamplingParams
from sleuth.agents.trajectory import Trajectory
from sleuth.tasks.base import Task
from sleuth.training.config import RolloutConfig
from sleuth.training.rollout.agent import AgentRollouts


def sampling(rc: RolloutConfig, seed: int) -> SamplingParams:
    """The rollout's sampling parameters under `seed`."""
    return SamplingParams(max_tokens=rc.max_tokens, temperature=rc.temperature, top_p=rc.top_p, seed=seed % (2**31))


def round_seed(run_seed: int, rank: int, step: int, round_: int, salt: int) -> int:
    """A seed of its own for this step, round and kind of group (`salt`), on this rank."""
    return run_seed * 1_000_003 + step * 1009 + round_ * 31 + salt + rank


def episode_round(make_env: Callable[[], gymnasium.Env], policy: Policy, agent: AgentRollouts | None,
                  rc: RolloutConfig, env_id: str, chosen: list[Task], key: str,
                  params: SamplingParams) -> list[Trajectory]:
    """A group of `rollout.group_size` episodes for each task of `chosen` (through the user's agent when there is
    one), each group under `TASK@key`."""
    if agent is not None:
        trajs = agent.round(chosen, rc.group_size)
    else:
        tasks = [t for t in chosen for _ in range(rc.group_size)]
        trajs = list(run_episodes(make_env, tasks, policy, params, rc.concurrency, env_id=env_id,
                                  env_threads=rc.env_threads, episode_timeout_s=rc.episode_timeout_s))
    for t in trajs:
        t.group = f"{t.task_id}@{key}"
    return trajs
