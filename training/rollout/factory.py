"""The rollout engine a config asks for: in this process (transformers), vLLM servers, or Ray rollout
workers. It lives apart from the engines' shared protocol (`training.rollout.in_process`) so that it can import every
engine without an engine importing it back."""

from __future__ import annotations

from typing import Any

import torch

from sleuth.core.errors import ConfigError
from sleuth.envs.families.opponents import SELF
from sleuth.training.cluster.placement import ClusterConfig
from sleuth.training.config import RolloutConfig
from sleuth.training.rl.update import UpdateConfig
from sleuth.training.rollout.in_process import RolloutEngine, SharedRollout, TransformersRollout
from sleuth.training.zero import DeepSpeedConfig, holds_whole_weights


def make_rollout(rollout: RolloutConfig, cluster: ClusterConfig, update: UpdateConfig, engine: DeepSpeedConfig,
                 module: torch.nn.Module, model_path: str, dtype: torch.dtype, probe_ids: list[int],
                 world: int = 1) -> RolloutEngine:
    """`rollout.inference` under `cluster.backend`, its syncs checked within `update.sync_tolerance` (or
    `update.sync_tolerance_vllm`: other kernels compute the same weights' logprobs a little apart); `world`
    training ranks share the cluster. Every engine computes in `dtype`, the trainer's resolved `deepspeed.dtype`.
    The transformers engine in this process runs the trainer's `module` itself where it can (`SharedRollout`)."""
    from sleuth.training.zero import device

    if cluster.backend == "ray":  # transformers or vLLM engines as Ray workers
        from sleuth.training.cluster.rollout_engine import RayRollout

        return RayRollout(rollout, cluster, update, model_path, dtype, probe_ids, world)
    if rollout.inference == "vllm":
        from sleuth.training.rollout.vllm_servers import VLLMRollout

        return VLLMRollout(rollout, model_path, probe_ids, update.sync_tolerance_vllm, dtype=dtype)
    if rollout.max_staleness == 0 and holds_whole_weights(engine):
        return SharedRollout(module, model_path, str(device()), max_batch=rollout.concurrency,
                             kv_keep_mb=rollout.kv_keep_mb)
    return TransformersRollout(model_path, str(device()), dtype, probe_ids, update.sync_tolerance,
                               max_batch=rollout.concurrency, kv_keep_mb=rollout.kv_keep_mb)


def self_play_args(env_args: dict[str, Any], rollout: RolloutEngine, rc: RolloutConfig) -> dict[str, Any]:
    """`opponent: self` (self-play) made the rollout servers' chat API, sampled as the rollouts are: the other seats
    play with the weights of the last verified sync. Other env args pass as they are."""
    if env_args.get("opponent") != SELF:
        return dict(env_args)
    from sleuth.training.rollout.vllm_servers import VLLMRollout

    if not isinstance(rollout, VLLMRollout):  # the config refuses it; a rollout built in code may not
        raise ConfigError("env_args opponent: self needs rollout.inference: vllm")
    return {**env_args, "opponent": {**rollout.chat_endpoint(), "temperature": rc.temperature,
                                     "max_tokens": rc.max_tokens}}
