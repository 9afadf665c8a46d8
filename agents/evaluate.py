"""Held-out evaluation: run a policy on tasks, append each finished trajectory to
`trajectories.jsonl` at once (so an interrupted run resumes where it stopped), then summarise.

A run directory records what it is a run of (`run.json`: env, env arguments, harness, policy and a
fingerprint of its weights, tasks, limit, sampling, samples); resuming into a directory that holds another
run's episodes is refused, so one directory never reports two runs as one."""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium
from tqdm import tqdm

from sleuth.agents.breakdown import breakdown, pass_at_ks
from sleuth.agents.loop import run_episodes
from sleuth.agents.policy import Policy, SamplingParams
from sleuth.agents.trajectory import Trajectory
from sleuth.net import retry_counts
from sleuth.rundir import RunDirLock
from sleuth.tasks.base import Task


def load_trajectories(path: Path) -> list[Trajectory]:
    """Read a trajectories file, skipping a torn last line left by a killed run."""
    out = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(Trajectory.from_json(line))
            except (json.JSONDecodeError, TypeError, KeyError):
                continue
    return out


def episode_metrics(t: Trajectory) -> dict[str, float]:
    """Per-episode numbers: the verdict's score and every numeric detail (EM/F1/recall for QA, tests
    passed for code, ...), plus what the turns did."""
    verdict = t.verdict or {}
    m = {"score": float(verdict.get("score", 0.0))}
    for key, value in verdict.get("details", {}).items():
        if isinstance(value, (int, float)) and key != "wall_s":
            m[key] = float(value)
    reads = [turn.read for turn in t.turns if turn.read]
    if reads:
        m.update(reads=float(len(reads)), gold_reads=float(sum(bool(r.gold) for r in reads)),
                 rereads=float(sum(r.reread for r in reads)))
    m.update(
        turns=float(len(t.turns)),
        tool_errors=float(sum(turn.error is not None for turn in t.turns)),
        answered=float(t.terminated),
        policy_tokens=float(t.num_policy_tokens),
        total_tokens=float(len(t.token_ids())),
    )
    m["tool_error_share"] = m["tool_errors"] / m["turns"] if m["turns"] else 0.0
    return m


def summarise(trajs: Sequence[Trajectory], wall_time_s: float, meta: dict[str, Any]) -> dict[str, Any]:
    """Means over the episodes that ran (`n`); failed episodes (`Trajectory.failed`: no answer) are counted
    apart in `n_failed` and score nothing. Two tool-call error rates, because they answer different
    questions: `tool_error_rate_turns` pools every turn of the run (invalid calls / turns), and
    `tool_error_rate_episodes` averages each episode's own share (what `sleuth compare` pairs by task)."""
    ok = [t for t in trajs if not t.failed]
    rows = [episode_metrics(t) for t in ok]
    n = len(rows)
    keys = list(dict.fromkeys(k for r in rows for k in r))

    def mean(key: str) -> float:  # an episode without the key (e.g. no reads) counts as 0
        return round(sum(r.get(key, 0.0) for r in rows) / n, 4) if n else 0.0

    summary: dict[str, Any] = {**meta, "n": n, "n_failed": len(trajs) - n,
                               "n_prompt_too_long": sum(t.stop_reason == "prompt_too_long" for t in ok)}
    skip = {"reads", "gold_reads", "rereads", "turns", "tool_errors", "answered", "policy_tokens", "total_tokens",
            "tool_error_share"}
    summary.update({k: mean(k) for k in keys if k not in skip})
    if any(turn.read for t in ok for turn in t.turns) or meta.get("env", "").endswith("DocRead-v0"):
        summary.update(mean_reads=mean("reads"), mean_gold_reads=mean("gold_reads"), mean_rereads=mean("rereads"))
    turns = sum(r["turns"] for r in rows)
    summary.update(
        mean_turns=mean("turns"),
        answered_rate=mean("answered"),
        tool_error_rate_turns=round(sum(r["tool_errors"] for r in rows) / turns, 4) if turns else 0.0,
        tool_error_rate_episodes=mean("tool_error_share"),
        policy_tokens=int(sum(r["policy_tokens"] for r in rows)),
        total_tokens=int(sum(r["total_tokens"] for r in rows)),
        wall_time_s=round(wall_time_s, 2),
    )
    return summary


RUN_FILE = "run.json"


class RunMismatchError(ValueError):
    """The output directory holds episodes of a different run."""


def check_run_identity(out: Path, identity: dict[str, Any], has_episodes: bool) -> None:
    """Refuse to resume into `out` when its episodes belong to another run; record `identity` otherwise."""
    path = out / RUN_FILE
    if has_episodes:
        if not path.exists():
            raise RunMismatchError(f"{out} holds episodes of an unrecorded run (no {RUN_FILE}): pass --no-resume to "
                                   "start over there, or choose another --out")
        old = json.loads(path.read_text(encoding="utf-8"))
        diff = [k for k in sorted(set(old) | set(identity)) if old.get(k) != identity.get(k)]
        if diff:
            said = "; ".join(f"{k}: {old.get(k)!r} there, {identity.get(k)!r} now" for k in diff)
            raise RunMismatchError(f"{out} holds another run's episodes ({said}): choose another --out, or pass "
                                   "--no-resume to replace them")
    path.write_text(json.dumps(identity, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def policy_identity(spec: str) -> dict[str, Any]:
    """The policy as a run's identity sees it: its spec, and for a local model directory its absolute path
    and a hash of its weights and config (a retrained model in the same place is another policy; the same
    weights exported again are not)."""
    path = Path(spec)
    if not path.is_dir():
        return {"spec": spec}
    digest = hashlib.sha256()
    for p in sorted(path.iterdir()):
        if p.is_file() and (p.suffix in (".safetensors", ".bin", ".gguf") or p.name == "config.json"):
            digest.update(p.name.encode())
            with open(p, "rb") as f:
                digest.update(hashlib.file_digest(f, "sha256").digest())
    return {"spec": spec, "path": str(path.resolve()), "weights": digest.hexdigest()[:16]}


def evaluate(
    make_env: Callable[[], gymnasium.Env],
    tasks: Sequence[Task],
    policy: Policy,
    out_dir: str | Path,
    sampling: SamplingParams | None = None,
    concurrency: int = 8,
    env_id: str = "",
    meta: dict[str, Any] | None = None,
    resume: bool = True,
    progress: bool = True,
    samples: int = 1,
    env_workers: int = 0,
    identity: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Evaluate and write `trajectories.jsonl`, `summary.json`, `report.md` and `report.png` in `out_dir`.
    `samples` episodes per task (pass@k is reported; sampling needs temperature > 0 or a seeded scripted
    policy, else the samples are one episode repeated). `identity` (what this run is; `sleuth eval` passes it)
    is checked against the directory's before resuming (`RunMismatchError`). The directory is owned by this
    call (`RunDirBusyError` if another process holds it). Failed episodes (`Trajectory.failed`) are
    counted in `n_failed`, never scored, and retried by the next resume (the failed records move to
    `failed.jsonl`)."""
    from sleuth.agents.report import write_report

    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError("task ids repeat: results are keyed by task id (load_tasks refuses or de-duplicates them)")
    out = Path(out_dir)
    with RunDirLock(out):
        traj_path, summary_path = out / "trajectories.jsonl", out / "summary.json"
        loaded = load_trajectories(traj_path) if resume else []
        if identity is not None:
            check_run_identity(out, identity, bool(loaded))
        done = [t for t in loaded if not t.failed]
        retried = [t for t in loaded if t.failed]
        if retried:  # kept, not lost: the record of each failure, beside the run
            with open(out / "failed.jsonl", "a", encoding="utf-8") as f:
                f.writelines(t.to_json() + "\n" for t in retried)
        # rewritten whole: without any torn last line, or the failed episodes being retried
        traj_path.write_text("".join(t.to_json() + "\n" for t in done), encoding="utf-8")
        previous_wall = 0.0
        if resume and done and summary_path.exists():
            previous_wall = float(json.loads(summary_path.read_text()).get("wall_time_s", 0.0))
        have = Counter(t.task_id for t in done)
        todo = [t for t in tasks for _ in range(max(0, samples - have[t.id]))]
        total = len(tasks) * samples
        start = time.perf_counter()
        retries0 = retry_counts()
        with open(traj_path, "a", encoding="utf-8") as f, tqdm(total=total, initial=total - len(todo),
                                                               desc=f"eval {policy.name}", disable=not progress) as bar:
            for traj in run_episodes(make_env, todo, policy, sampling, concurrency, env_id, env_workers=env_workers):
                traj.meta["sample"] = have[traj.task_id]
                have[traj.task_id] += 1
                f.write(traj.to_json() + "\n")
                f.flush()
                done.append(traj)
                bar.update(1)
        wall = previous_wall + time.perf_counter() - start
        order = {t.id: i for i, t in enumerate(tasks)}
        done.sort(key=lambda t: (order.get(t.task_id, len(order)), t.meta.get("sample", 0)))
        summary = summarise(done, wall, {"policy": policy.name, "env": env_id, "samples": samples, **(meta or {})})
        summary["http_retries"] = {k: v - retries0.get(k, 0) for k, v in retry_counts().items()
                                   if v > retries0.get(k, 0)}
        summary["retried_failed"] = len(retried)
        summary.update(pass_at_ks(done))
        summary["breakdown"] = breakdown(done, tasks)
        summary_path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        write_report(out, summary, done)
    return summary
