"""Checkpoints: the DeepSpeed engine (weights, optimizer, every rank's ZeRO partition) + the trainer's
own state (step, data position, policy version) + every rank's RNG state, under one tag per step.

DeepSpeed writes its `latest` pointer last, so a run killed while saving resumes from the previous
complete checkpoint."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save(engine: Any, root: Path, step: int, trainer_state: dict[str, Any], keep: int) -> Path:
    """Save on every rank (collective); returns the tag directory."""
    import torch.distributed as dist

    rank = dist.get_rank()
    tag = f"step-{step:06d}"
    (root / tag).mkdir(parents=True, exist_ok=True)
    torch.save(rng_state(), root / tag / f"rng_rank{rank}.pt")
    engine.save_checkpoint(str(root), tag=tag, client_state={"trainer": trainer_state})
    dist.barrier()
    if rank == 0 and keep > 0:
        tags = sorted(p for p in root.glob("step-*") if p.is_dir())
        for old in tags[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return root / tag


def latest(root: Path) -> str | None:
    f = root / "latest"
    return f.read_text().strip() if f.exists() else None


def load(engine: Any, root: Path) -> dict[str, Any] | None:
    """Restore the newest complete checkpoint; returns the trainer state, or None when there is none."""
    import torch.distributed as dist

    tag = latest(root)
    if tag is None:
        return None
    path, client = engine.load_checkpoint(str(root), tag=tag)
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load checkpoint {root / tag}")
    rng = root / tag / f"rng_rank{dist.get_rank()}.pt"
    if rng.exists():
        set_rng_state(torch.load(rng, weights_only=False))
    return client["trainer"]


def export_hf(engine: Any, base_path: str, out: Path, tokenizer: Any) -> Path | None:
    """A Hugging Face model directory (fp32) with the trained (LoRA-merged) weights; collective, rank 0
    writes. A bf16 engine exports its fp32 master weights, so that a next stage (RL after SFT) starts its
    own masters from them and not from their bf16 rounding."""
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from sleuth.training.engine import fp32_masters, full_state_dict

    state = full_state_dict(engine.module)
    masters = fp32_masters(engine)
    if dist.get_rank() != 0:
        return None
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    if masters is not None:  # loaded last: a tied head takes its embeddings' master too
        model.load_state_dict({k: v for k, v in masters.items() if k in state}, strict=False)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
