"""Rollout engines as the trainer sees them: a `Policy` for the agent loop, plus a verified weight sync.

After every update the trainer's weights reach the engine, the engine's version is bumped (every turn it
generates is stamped with it), and the sync is *checked*: the engine's logits (or logprobs) on a fixed
probe prompt must match the trainer's within a tolerance, else `WeightSyncError`."""

from __future__ import annotations

from typing import Protocol

import torch

from sleuth.agents.policies.base import Policy
from sleuth.core.errors import InfraFailure
from sleuth.training.zero import full_parameters, full_state_dict, lora_merged_weights


class WeightSyncError(InfraFailure):
    pass


class RolloutServerError(InfraFailure):
    """A rollout server that cannot be reached or started. A ConfigError, so `sleuth train` refuses in one
    line: what fixes it is a setting (`rollout.vllm_url`, `rollout.vllm_python`) or a server started."""


class RolloutEngine(Protocol):
    policy: Policy

    def sync(self, module: torch.nn.Module) -> dict[str, float]: ...

    def close(self) -> None: ...


@torch.no_grad()
def probe_logits(model: torch.nn.Module, probe_ids: list[int]) -> torch.Tensor:
    """fp32 logits of the next token after `probe_ids`. A LoRA model runs its merged weights (what a sync
    sends), not base + adapter: in bf16 the two round apart by far more than a sync check's tolerance."""
    from peft import PeftModel

    dev = next(model.parameters()).device
    ids = torch.tensor([probe_ids], device=dev)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if not isinstance(model, PeftModel):
        return model(**inputs).logits[0, -1].float().cpu()
    with full_parameters(model):
        merged = lora_merged_weights(model)
        with model.disable_adapter():  # base layers only, their weights swapped for the merged ones
            logits = torch.func.functional_call(model, merged, args=(), kwargs=inputs).logits
    return logits[0, -1].float().cpu()


class TransformersRollout:
    """The in-process transformers policy, holding its own copy of the weights (as a separate inference
    engine would): the sync copies the trainer's full weights into it."""

    def __init__(self, model_path: str, device: str | None, dtype: torch.dtype, probe_ids: list[int],
                 tolerance: float, max_batch: int = 16, kv_keep_mb: int = 1024):
        from sleuth.agents.policies.hf import TransformersPolicy

        self.policy = TransformersPolicy(model_path, device=device, dtype=dtype, max_batch=max_batch,
                                         kv_keep_mb=kv_keep_mb)
        self.probe_ids, self.tolerance = probe_ids, tolerance

    def sync(self, module: torch.nn.Module) -> dict[str, float]:
        state = full_state_dict(module)
        missing, unexpected = self.policy.model.load_state_dict(state, strict=False)
        if unexpected or [k for k in missing if "lm_head" not in k]:  # lm_head may be tied to the embeddings
            raise WeightSyncError(f"weights do not fit the rollout model: missing {missing[:5]}, "
                                  f"unexpected {unexpected[:5]}")
        self.policy.version += 1
        return self.verify(module)

    def verify(self, module: torch.nn.Module) -> dict[str, float]:
        ours = probe_logits(module, self.probe_ids)
        theirs = probe_logits(self.policy.model, self.probe_ids)
        diff = float((ours - theirs).abs().max())
        if not diff <= self.tolerance:
            raise WeightSyncError(f"after sync the rollout engine's probe logits differ from the trainer's by "
                                  f"{diff:.3g} (> {self.tolerance}): the engine is not running the new weights")
        return {"sync/max_logit_diff": diff}

    def close(self) -> None:
        pass


class SharedRollout:
    """The in-process transformers policy running the trainer's own module: one copy of the weights in the
    process instead of two (SmolLM2 in fp32: 0.54 GB less), and a sync with nothing to copy or check — the
    engine reads the very tensors the optimizer updated in place. It is right only where the module holds
    whole weights (ZeRO ≤ 2, no LoRA adapter to merge) and no rollout runs during an update
    (`rollout.max_staleness: 0`); `make_rollout` picks it then. The update puts the module in train mode; the
    sync puts it back in eval mode, which generation needs (no dropout, and a KV cache under checkpointing)."""

    def __init__(self, module: torch.nn.Module, model_path: str, device: str, max_batch: int = 16,
                 kv_keep_mb: int = 1024):
        from sleuth.agents.policies.hf import TransformersPolicy

        self.policy = TransformersPolicy(model_path, device=device, max_batch=max_batch, kv_keep_mb=kv_keep_mb,
                                         module=module)

    def sync(self, module: torch.nn.Module) -> dict[str, float]:
        if module is not self.policy.model:
            raise WeightSyncError("the shared rollout engine runs the trainer's own module; it was asked to sync "
                                  "another one")
        module.eval()
        self.policy.version += 1  # kept KV states of the old weights are never reused
        return {}

    def close(self) -> None:
        pass
