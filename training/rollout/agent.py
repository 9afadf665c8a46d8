"""A user's agent as the trainer's source of rollouts: the agent (a Python function, or a program run per
episode: `agents.gateway.agent_runner.CommandAgent`) runs unchanged against the OpenAI-compatible gateway over the
rollout engine's policy (served in this process), and each step's trajectories are what the gateway recorded
of its calls. Sampling is the config's whatever the agent asks (`Gateway.fixed_sampling`):
the trainer divides its logits by `rollout.temperature`, so the recorded logprobs must be of that
temperature. The weight sync's gate holds the gateway's calls too."""

from __future__ import annotations

from typing import Any

from sleuth.agents.gateway import Gateway, create_app
from sleuth.agents.gateway.agent_runner import CommandAgent, load_agent, run_agent_episodes
from sleuth.agents.policies.base import Policy, SamplingParams
from sleuth.agents.policies.requests import WeightsGate
from sleuth.agents.trajectory import Trajectory
from sleuth.core.net import in_thread
from sleuth.tasks.base import Task
from sleuth.training.config import AgentConfig


class AgentRollouts:
    def __init__(self, cfg: AgentConfig, policy: Policy, gate: WeightsGate, sampling: SamplingParams,
                 episode_timeout_s: float | None):
        self.cfg, self.episode_timeout_s = cfg, episode_timeout_s
        self.agent = (load_agent(cfg.entrypoint, cfg.path) if cfg.entrypoint
                      else CommandAgent(cfg.command or "", cfg.path, cfg.timeout_s))
        self.gateway = Gateway(policy, sampling, gate, fixed_sampling=True)
        self._server: Any = in_thread(create_app(self.gateway))
        self.url = self._server.__enter__()

    def round(self, tasks: list[Task], group_size: int) -> list[Trajectory]:
        """`group_size` episodes of each task, every segment of each (see `rewards.episodes.per_episode`)."""
        return list(run_agent_episodes(self.agent, tasks, self.gateway, self.url, self.cfg.verifier,
                                       self.cfg.concurrency, samples=group_size, timeout_s=self.episode_timeout_s))

    def close(self) -> None:
        self.gateway.close()
        self._server.__exit__(None, None, None)
