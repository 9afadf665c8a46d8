"""Checkpoints: the DeepSpeed engine (weights, optimizer, every rank's ZeRO partition) + the trainer's
own state (step, data position, policy version) + every rank's RNG state, under one tag per step.

A save is atomic: every rank writes into a temporary directory (`.tmp-step-N`), rank 0 then writes a
completeness marker (`COMPLETE.json`: every file with its size, after an fsync) and renames the directory
to its tag, and only then points `latest` at it. A run killed while saving leaves a temporary directory,
never a tag; a tag whose files no longer match its marker (a truncated file) is damaged. Resuming loads
the newest complete checkpoint, says which newer ones it skipped and why, and fails in one line when none
is complete. Pruning (`keep`) counts complete checkpoints only, so it never deletes the last good one."""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sleuth.core.errors import TrainingError

MARKER = "COMPLETE.json"
TMP_PREFIX = ".tmp-"


class CheckpointError(TrainingError):
    """No checkpoint of the run can be restored."""


@dataclass
class Restored:
    state: dict[str, Any]  # the trainer state saved with the checkpoint
    tag: str
    skipped: list[tuple[str, str]] = field(default_factory=list)  # newer tags that could not be used, and why


def own_run_dir(out: Path) -> Any:
    """Rank 0 takes `out`'s `RunDirLock` for the whole run and returns it (None on other ranks); collective:
    when another process owns the directory, every rank raises `RunDirBusyError` with its one-line message."""
    import torch.distributed as dist

    from sleuth.core.rundir import RunDirBusyError, RunDirLock

    lock, error = None, None
    if dist.get_rank() == 0:
        try:
            lock = RunDirLock(out).acquire()
        except RunDirBusyError as e:
            error = str(e)
    if dist.get_world_size() > 1:
        box = [error]
        dist.broadcast_object_list(box, src=0)
        error = box[0]
    if error is not None:
        raise RunDirBusyError(error)
    return lock


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def tag_of(step: int) -> str:
    return f"step-{step:06d}"


def save(engine: Any, root: Path, step: int, trainer_state: dict[str, Any], keep: int) -> Path:
    """Save on every rank (collective) into a temporary directory, seal it and rename it to its tag, then
    move `latest` and prune; returns the tag directory."""
    import torch.distributed as dist

    rank = dist.get_rank()
    tag = tag_of(step)
    tmp = root / f"{TMP_PREFIX}{tag}"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # a save of this step that died part-way
        tmp.mkdir(parents=True)
    dist.barrier()
    torch.save(rng_state(), tmp / f"rng_rank{rank}.pt")
    engine.save_checkpoint(str(root), tag=tmp.name, client_state={"trainer": trainer_state}, save_latest=False)
    dist.barrier()
    if rank == 0:
        _seal(tmp, step)
        final = root / tag
        if final.exists():  # written before the checkpoint this run resumed from was restored: superseded
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync(root)
        _write_latest(root, tag)
        if keep > 0:
            prune(root, keep)
    dist.barrier()
    return root / tag


def _seal(tmp: Path, step: int) -> None:
    """Flush every file of the checkpoint to disk, then write the marker that lists them with their sizes."""
    files = {}
    for f in sorted(p for p in tmp.rglob("*") if p.is_file()):
        _fsync(f)
        files[str(f.relative_to(tmp))] = f.stat().st_size
    part = tmp / f"{MARKER}.part"
    part.write_text(json.dumps({"step": step, "files": files}), encoding="utf-8")
    _fsync(part)
    os.replace(part, tmp / MARKER)
    _fsync(tmp)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_latest(root: Path, tag: str) -> None:
    part = root / "latest.part"
    part.write_text(tag)
    _fsync(part)
    os.replace(part, root / "latest")


def latest(root: Path) -> str | None:
    f = root / "latest"
    return f.read_text().strip() if f.exists() else None


def has_run(root: Path) -> bool:
    """Whether `root` holds checkpoints of a run (complete or not): a new run must not overwrite them."""
    return latest(root) is not None or bool(_tags(root))


def _tags(root: Path) -> list[Path]:
    """The tag directories, newest step first."""
    return sorted((p for p in root.glob("step-*") if p.is_dir()), key=lambda p: p.name, reverse=True)


def damage(path: Path, pointer: str | None = None) -> str | None:
    """Why checkpoint directory `path` cannot be trusted, or None when it is complete. A directory without a
    marker is complete only when `latest` names it (`pointer`): a checkpoint written before markers existed."""
    marker = path / MARKER
    if not marker.is_file():
        return None if path.name == pointer else f"has no {MARKER} (its write never finished)"
    try:
        files = json.loads(marker.read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"has an unreadable {MARKER}"
    for rel, size in files.items():
        f = path / rel
        if not f.is_file():
            return f"lost {rel}"
        if (got := f.stat().st_size) != size:
            return f"has {rel} cut to {got} of {size} bytes"
    return None


def prune(root: Path, keep: int) -> None:
    """Delete every tag older than the `keep`-th newest complete checkpoint, and dead temporary directories;
    the newest complete checkpoints (and anything newer than them) stay."""
    pointer = latest(root)
    tags = _tags(root)
    complete = [p for p in tags if damage(p, pointer) is None]
    if len(complete) > keep:
        cutoff = complete[keep - 1].name
        for old in tags:
            if old.name < cutoff:
                shutil.rmtree(old, ignore_errors=True)
    for tmp in root.glob(f"{TMP_PREFIX}step-*"):
        shutil.rmtree(tmp, ignore_errors=True)


def load(engine: Any, root: Path) -> Restored | None:
    """Restore the newest complete checkpoint (collective; every rank decides alike). None when `root` holds
    no checkpoint; `CheckpointError` when it holds some and none can be restored."""
    import torch.distributed as dist

    from sleuth.training.zero import device

    pointer = latest(root)
    tags = _tags(root)
    if not tags:
        if pointer is not None:
            raise CheckpointError(f"{root}/latest names {pointer}, which does not exist, and no other checkpoint "
                                  "is there: start a new run in another --out")
        return None
    skipped: list[tuple[str, str]] = []
    for path in tags:
        why = damage(path, pointer)
        client = None
        if why is None:
            try:
                loaded, client = engine.load_checkpoint(str(root), tag=path.name)
                if loaded is None:
                    why = "holds no DeepSpeed checkpoint files"
            except Exception as e:  # bytes damaged in place (the sizes still match): unreadable
                why = f"does not load ({type(e).__name__}: {_first_line(e)})"
            ok = torch.tensor([0.0 if why else 1.0], device=device())  # NCCL reduces CUDA tensors only
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)  # a checkpoint counts only if every rank restored it
            if why is None and float(ok) < 1:
                why = "did not load on another rank"
        if why is None and client is not None:
            rng = path / f"rng_rank{dist.get_rank()}.pt"
            if rng.exists():
                set_rng_state(torch.load(rng, weights_only=False))
            return Restored(client["trainer"], path.name, skipped)
        skipped.append((path.name, why or "could not be restored"))
    raise CheckpointError(f"no complete checkpoint in {root}: " + "; ".join(f"{t} {w}" for t, w in skipped)
                          + " — start a new run in another --out")


def resume(engine: Any, root: Path, out: Path) -> dict[str, Any] | None:
    """`load`, and say on rank 0's stderr (one line each) which checkpoint the run continues from, which
    damaged newer ones it skipped, or that there was none."""
    import torch.distributed as dist

    restored = load(engine, root)
    if dist.get_rank() == 0:
        if restored is None:
            print(f"no checkpoint in {out}: starting from step 0", file=sys.stderr)
        else:
            if restored.skipped:
                print(f"skipped damaged checkpoint{'s' if len(restored.skipped) > 1 else ''} "
                      + "; ".join(f"{t} ({w})" for t, w in restored.skipped)
                      + f": falling back to {restored.tag}", file=sys.stderr)
            print(f"resumed {out} from step {restored.state['step']} (checkpoint {restored.tag})", file=sys.stderr)
    return restored.state if restored is not None else None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0]


def export_hf(engine: Any, base_path: str, out: Path, tokenizer: Any) -> Path | None:
    """A Hugging Face model directory (fp32) with the trained (LoRA-merged) weights; collective, rank 0
    writes. A bf16 engine exports its fp32 master weights, so that a next stage (RL after SFT) starts its
    own masters from them and not from their bf16 rounding."""
    import torch.distributed as dist

    from sleuth.agents.policies.models import load_causal_lm
    from sleuth.training.zero import fp32_masters, full_state_dict

    state = full_state_dict(engine.module)
    masters = fp32_masters(engine)
    if dist.get_rank() != 0:
        return None
    model = load_causal_lm(base_path, torch.float32)
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    if masters is not None:  # loaded last: a tied head takes its embeddings' master too
        model.load_state_dict({k: v for k, v in masters.items() if k in state}, strict=False)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
