"""Adapters that put sleuth verifiers inside other trainers: TRL (`trl_reward`), verl (`compute_score`),
OpenRLHF (`reward_func` and the remote reward protocol). None of them imports torch or the trainer."""

from sleuth.verifiers.adapters.openrlhf import openrlhf_rewards, reward_func
from sleuth.verifiers.adapters.trl import trl_reward
from sleuth.verifiers.adapters.verl import compute_score

__all__ = ["trl_reward", "compute_score", "reward_func", "openrlhf_rewards"]
