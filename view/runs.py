"""Run directories as the viewer reads them: which kind of run a folder is, what ran, its summary, metrics,
reports and the index over its episodes. It reads the files `sleuth eval` (and agents through the gateway),
`sleuth train`, `sleuth sft` and `make run` write; a folder of runs (runs/main) opens as its sub-runs."""

from __future__ import annotations

import json
import math
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sleuth.core.errors import BadInput
from sleuth.view.index import CHUNK, RunIndex

EVAL_FILES = ("trajectories.jsonl", "summary.json", "run.json")
TRAIN_FILES = ("metrics.jsonl", "config.yaml")
REPORT_SUFFIXES = (".md", ".png", ".txt", ".jpg")
SKIP_DIRS = {"hf", "tensorboard", "checkpoints", "rollouts", "data", "__pycache__", "wandb"}
MAX_METRIC_ROWS = 5000
LIVE_S = 60.0
STEP_FILE = re.compile(r"step-(\d+)\.rank(\d+)\.jsonl$")
ROUND_FILE = re.compile(r"round-(\d+)\.jsonl$")


class RunError(BadInput):
    """A path that is not a run directory sleuth wrote (the CLI prints it as one line and exits 2)."""


def clean(x: Any) -> Any:
    """`x` with NaN and infinities as None: JSON has no such numbers and the browser's parser refuses them."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [clean(v) for v in x]
    return x


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError):
        return None


def _read_yaml(path: Path) -> Any:
    import yaml

    try:
        return yaml.safe_load(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, yaml.YAMLError):
        return None


def is_run(d: Path) -> bool:
    return any((d / f).is_file() for f in (*EVAL_FILES, *TRAIN_FILES)) or (d / "rollouts").is_dir()


def run_kind(d: Path) -> str:
    config = _read_yaml(d / "config.yaml") if (d / "config.yaml").is_file() else None
    if (d / "data").is_dir() and any((d / "data").glob("round-*.jsonl")) or (
            isinstance(config, dict) and isinstance(config.get("data"), dict)):
        return "sft"
    if (d / "metrics.jsonl").is_file() or (d / "rollouts").is_dir() or config is not None:
        return "train"
    if any((d / f).is_file() for f in EVAL_FILES):
        run = _read_json(d / "run.json")
        return "agent" if isinstance(run, dict) and "agent" in run else "eval"
    return "unknown"


@dataclass
class Run:
    """One run directory and the index over its episodes (built in the background, grown as the run writes)."""

    id: str
    name: str
    path: Path
    kind: str
    root: Path  # the folder given on the command line (itself, or the folder of runs it is in)
    index: RunIndex = field(default_factory=RunIndex)
    scan_lock: threading.Lock = field(default_factory=threading.Lock)

    def discover(self) -> None:
        """Add the episode files written since the last look (a training run writes one per step and rank)."""
        if self.kind in ("eval", "agent", "unknown"):
            self.index.add_source(self.path / "trajectories.jsonl")
        elif self.kind == "train":
            for p in sorted((self.path / "rollouts").glob("step-*.rank*.jsonl")):
                if m := STEP_FILE.search(p.name):
                    self.index.add_source(p, int(m.group(1)))
        else:
            for p in sorted((self.path / "data").glob("round-*.jsonl")):
                if m := ROUND_FILE.search(p.name):
                    self.index.add_source(p, int(m.group(1)))

    def update(self, need: int = 0) -> None:
        """Index until at least `need` records are known or the files end; with `need` 0, one bounded slice."""
        if 0 < need <= len(self.index):
            return
        with self.scan_lock:
            self.discover()
            if need <= 0:
                self.index.refresh(CHUNK)
            while len(self.index) < need and self.index.refresh(CHUNK) > 0:
                pass

    def complete(self) -> bool:
        return not self.index.pending()

    def live(self) -> bool:
        """Written to in the last minute, or still being indexed: the page polls."""
        newest = max((s.path.stat().st_mtime for s in self.index.sources if s.path.exists()), default=0.0)
        for f in ("metrics.jsonl", "summary.json", "trajectories.jsonl"):
            if (self.path / f).is_file():
                newest = max(newest, (self.path / f).stat().st_mtime)
        return time.time() - newest < LIVE_S or not self.complete()

    def brief(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "path": str(self.path), "kind": self.kind}

    def meta(self) -> dict[str, Any]:
        """What ran: run.json (eval), config.yaml (train, sft), and the summary's own description."""
        out: dict[str, Any] = {}
        for name in ("run.json", "config.yaml"):
            p = self.path / name
            data = _read_json(p) if name.endswith(".json") else _read_yaml(p) if p.is_file() else None
            if isinstance(data, dict):
                out.update(data)
        summary = self.summary()
        if isinstance(summary, dict) and isinstance(summary.get("meta"), dict):
            out.setdefault("summary_meta", summary["meta"])
        return clean(json.loads(json.dumps(out, default=str)))

    def summary(self) -> dict[str, Any] | None:
        data = _read_json(self.path / "summary.json")
        return clean(data) if isinstance(data, dict) else None

    def metrics(self) -> list[dict[str, Any]]:
        """metrics.jsonl's rows, at most MAX_METRIC_ROWS evenly thinned (the last one always kept)."""
        path = self.path / "metrics.jsonl"
        if not path.is_file():
            return []
        rows = []
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict):
                    rows.append(row)
        if len(rows) > MAX_METRIC_ROWS:
            stride = len(rows) / MAX_METRIC_ROWS
            rows = [rows[int(k * stride)] for k in range(MAX_METRIC_ROWS - 1)] + [rows[-1]]
        return clean(rows)

    def reports(self) -> list[str]:
        return sorted(p.name for p in self.path.iterdir() if p.is_file() and p.suffix in REPORT_SUFFIXES)

    def stage_times(self) -> dict[str, float] | None:
        """`make run`'s stages.jsonl (in the run or the folder of runs it is in): the last record per stage."""
        for d in (self.path, self.root):
            path = d / "stages.jsonl"
            if path.is_file():
                out: dict[str, float] = {}
                for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                    try:
                        r = json.loads(line)
                        out[str(r["stage"])] = float(r["seconds"])
                    except (ValueError, KeyError, TypeError):
                        continue
                return out
        return None

    def model(self) -> str | None:
        """The model the run names (the policy of an eval, the trained model of a training run)."""
        for name in ("run.json", "config.yaml"):
            p = self.path / name
            data = _read_json(p) if name.endswith(".json") else _read_yaml(p) if p.is_file() else None
            if not isinstance(data, dict):
                continue
            policy = data.get("policy")
            if isinstance(policy, dict):
                return policy.get("path") or policy.get("spec")
            if isinstance(data.get("model"), str):
                return data["model"]
        return None


def open_runs(paths: list[str | Path]) -> list[Run]:
    """The runs under `paths`, numbered "0", "1", ... in order; a folder of runs gives each of its runs."""
    found: list[tuple[Path, Path]] = []
    for given in paths:
        root = Path(given).expanduser().resolve()
        if not root.is_dir():
            raise RunError(f"{given}: no such directory (give a run directory sleuth wrote, e.g. runs/main)")
        subs = [root] if is_run(root) else _sub_runs(root, depth=3)
        if not subs:
            raise RunError(f"{given} is not a run directory: no trajectories.jsonl, summary.json, run.json, "
                           "metrics.jsonl or config.yaml in it or its sub-folders")
        found += [(root, d) for d in subs]
    runs = []
    for k, (root, d) in enumerate(found):
        name = d.name if d == root else f"{root.name}/{d.relative_to(root).as_posix()}"
        runs.append(Run(str(k), name, d, run_kind(d), root))
    return runs


def _sub_runs(d: Path, depth: int) -> list[Path]:
    out: list[Path] = []
    if depth == 0:
        return out
    for child in sorted(p for p in d.iterdir() if p.is_dir() and p.name not in SKIP_DIRS):
        out += [child] if is_run(child) else _sub_runs(child, depth - 1)
    return out
