"""Agents: policies (token ids in, ids + logprobs out), chat rendering, the agent loop, evaluation.

Importing this package loads no torch; `TransformersPolicy` lives in `sleuth.agents.policies.hf`."""

from sleuth.agents.chat import ChatRenderer
from sleuth.agents.loop.episodes import run_episodes
from sleuth.agents.policies.base import Generation, Policy, Request, SamplingParams
from sleuth.agents.policies.load import load_policy, load_tokenizer
from sleuth.agents.trajectory import Trajectory, Turn

__all__ = ["ChatRenderer", "run_episodes", "load_policy", "load_tokenizer", "Generation", "Policy", "Request",
           "SamplingParams", "Trajectory", "Turn"]
