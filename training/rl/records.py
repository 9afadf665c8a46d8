"""What a training step writes beside its update: every trajectory of the step as the agent loop recorded it
(`rollouts/step-N.rankR.jsonl`) and the advantages the loss used for the kept ones (`rollouts/credit/`), which the
viewer shows; never recomputed elsewhere."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sleuth.agents.trajectory import Trajectory


def write_rollouts(out: Path, step: int, rank: int, trajs: Sequence[Trajectory]) -> None:
    """Every trajectory of the step, as the agent loop recorded it (one file per rank)."""
    d = out / "rollouts"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"step-{step:06d}.rank{rank}.jsonl").write_text("".join(t.to_json() + "\n" for t in trajs), encoding="utf-8")


def write_credit(out: Path, step: int, rank: int, seen: Sequence[Trajectory], kept: Sequence[Trajectory],
                 advantages: Sequence[np.ndarray]) -> None:
    """The credit sidecar of the step's rollouts file (in rollouts/credit/): one line per kept trajectory, `line`
    its line in the rollouts file, `adv` one value per action token (turns' action ids concatenated, the loss
    mask's order); gear_mix's (tokens, K) granularities are written as `adv_k` rows, with `adv` their mean (the
    mixed value exists only inside the update)."""
    line = {id(t): k for k, t in enumerate(seen)}
    rows = []
    for t, a in zip(kept, advantages, strict=True):
        a = np.asarray(a, dtype=np.float64)
        row: dict[str, Any] = {"task_id": t.task_id, "group": t.group, "line": line.get(id(t))}
        row["adv"] = (a if a.ndim == 1 else a.mean(axis=1)).tolist()
        if a.ndim > 1:
            row["adv_k"] = a.tolist()
        rows.append(json.dumps(row) + "\n")
    path = out / "rollouts" / "credit" / f"step-{step:06d}.rank{rank}.jsonl"  # beside, not among, the rollouts:
    path.parent.mkdir(exist_ok=True)  # readers of rollouts/*.jsonl read trajectories only
    path.write_text("".join(rows), encoding="utf-8")
