"""Training metrics: one JSON line per step in `metrics.jsonl` plus TensorBoard scalars (and Weights & Biases
when configured), and PNG plots.

On resume the log is cut back to the checkpointed step, so the file always reads as one continuous run."""

from __future__ import annotations

import json
import math
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MISMATCH_WARN = 0.01  # mean |Δlogp| between rollout engine and trainer above this is reported as unhealthy


@dataclass
class WandbConfig:
    """Weights & Biases, beside JSONL and TensorBoard: on when `project` is set (or `$WANDB_PROJECT`).
    `mode: offline` writes the run under OUT/wandb without a network (`wandb sync` uploads it later)."""
    project: str | None = None
    mode: str = "offline"  # offline | online
    name: str | None = None  # default: the run directory's name
    entity: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("offline", "online"):
            raise ValueError(f"wandb.mode must be offline or online; got {self.mode!r}")

    def resolved_project(self) -> str | None:
        return self.project or os.environ.get("WANDB_PROJECT") or None


class MetricsLogger:
    def __init__(self, out: Path, resume_step: int = 0, tensorboard: bool = True, wandb: WandbConfig | None = None,
                 config: dict[str, Any] | None = None):
        self.path = Path(out) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step] if resume_step else []
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
        self.tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(Path(out) / "tensorboard"), purge_step=resume_step + 1 if resume_step else None)
        self.wandb = None
        if wandb is not None and wandb.resolved_project():
            self.wandb = _wandb_run(Path(out), wandb, config or {}, resume_step)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        if self.tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                    self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float))}, step=step,
                           commit=True)  # each step is whole when logged: commit it now

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def _wandb_run(out: Path, cfg: WandbConfig, config: dict[str, Any], resume_step: int) -> Any:
    try:
        import wandb
    except ImportError:
        raise ImportError("wandb.project is set but wandb is not installed: pip install 'sleuth[wandb]'") from None
    # one W&B run per run directory, its id kept there, so --resume continues the same W&B run
    id_file = out / "wandb" / "run-id"
    id_file.parent.mkdir(parents=True, exist_ok=True)
    run_id = id_file.read_text().strip() if resume_step and id_file.exists() else secrets.token_hex(4)
    id_file.write_text(run_id)
    return wandb.init(project=cfg.resolved_project(), entity=cfg.entity, name=cfg.name or out.name, id=run_id,
                      resume="allow", mode=cfg.mode, dir=str(out), config=config)


def _plain(v: Any) -> Any:
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    if hasattr(v, "item") and getattr(v, "numel", lambda: 0)() == 1:
        return v.item()
    return v


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Rows of a metrics file: JSON objects with a numeric `step`; a torn last line (a killed run) and any
    other line that is not such a row are skipped."""
    rows = []
    if Path(path).exists():
        for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), (int, float)):
                rows.append(row)
    return rows


def describe(name: str, values: Sequence[float] | np.ndarray,
             stats: Sequence[str] = ("mean", "std")) -> dict[str, float]:
    """{name/mean, name/std, name/p50, name/p99, name/max, name/absmax} for the requested stats (NaN if empty)."""
    v = np.asarray(values, dtype=np.float64)
    fns = {"mean": np.mean, "std": np.std, "p50": lambda x: np.percentile(x, 50),
           "p99": lambda x: np.percentile(x, 99), "max": np.max, "min": np.min, "absmax": lambda x: np.abs(x).max()}
    return {f"{name}/{s}": (float(fns[s](v)) if v.size else float("nan")) for s in stats}


PLOTS = [
    ("reward", ["reward/mean", "eval/score"]),
    ("loss", ["loss/policy", "loss/kl", "loss/entropy", "loss/mix"]),
    ("kl and entropy", ["kl/mean", "entropy/mean"]),
    ("clipping", ["clip/low", "clip/high", "clip/dual", "clip/log_ratio_clamp"]),
    ("group effective sample size", ["groups/ess_mean", "groups/ess_min"]),
    ("ratio", ["ratio/p99", "ppo_kl"]),
    ("engine-trainer mismatch", ["mismatch/mean", "mismatch/p99"]),
    ("zero-variance groups", ["groups/zero_var", "groups/zero_var_expected", "groups/no_signal"]),
    ("episodes sampled, and failed (never trained)", ["episodes/sampled", "episodes/failed", "groups/dropped_failed"]),
    ("grad norm", ["grad_norm"]),
    ("response length", ["length/correct", "length/wrong"]),
    ("time per stage (s)", ["time/rollout", "time/reward", "time/update", "time/sync"]),
]

SFT_PLOTS = [
    ("loss (mean NLL per policy token)", ["loss/nll"]),
    ("grad norm", ["grad_norm"]),
    ("tokens/s", ["tokens_per_s"]),
    ("rejection sampling", ["data/accept_rate", "data/sampled_score"]),
]


def plot_run(run_dir: Path, panels: Sequence[tuple[str, list[str]]] | None = None) -> list[Path]:
    """One PNG of training curves per run directory (`sleuth plot RUN`); `panels` defaults to the RL run's,
    or the SFT run's when the run logged `loss/nll`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(Path(run_dir) / "metrics.jsonl")
    if not rows:
        raise FileNotFoundError(f"no metrics in {Path(run_dir) / 'metrics.jsonl'}")
    panels = panels or (SFT_PLOTS if "loss/nll" in rows[0] else PLOTS)
    from matplotlib.ticker import MaxNLocator

    first, last = min(r["step"] for r in rows), max(r["step"] for r in rows)
    cols = 3
    fig, axes = plt.subplots(-(-len(panels) // cols), cols, figsize=(14, 3.3 * -(-len(panels) // cols)), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (title, keys) in zip(axes.flat, panels, strict=False):
        for key in keys:
            pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", ms=3, label=key)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        if first == last:  # one step: a unit-wide axis, not 0.96 … 1.04
            ax.set_xlim(first - 1, last + 1)
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    out = Path(run_dir) / "training.png"
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return [out]
