"""experiments/soak.py's verdict: steps, faults and memory judged from what the soak wrote (report.md, memory.png)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def failure_reasons(run: Path) -> Counter:
    """Infrastructure failures over the run's rollouts files, by stop reason."""
    out: Counter = Counter()
    for f in sorted((run / "rollouts").glob("*.jsonl")):
        for t in _jsonl(f):
            if t.get("error") is not None:
                out[t["stop_reason"]] += 1
    return out


def slopes(mem: list[dict], warmup_s: float, span_s: float) -> list[dict[str, Any]]:
    """Per process: its resident memory's least-squares slope (MB/h) after its warm-up (`warmup_s` from the run's
    start, or from its own first sample for a process started later: a restarted worker), and whether it lived long
    enough after that (half the rest of the run) to be judged."""
    by_pid: dict[int, list[tuple[float, float]]] = defaultdict(list)
    names: dict[int, str] = {}
    born: dict[int, float] = {}
    for m in mem:
        names[m["pid"]] = m["name"]
        born.setdefault(m["pid"], m["t"])
        if m["t"] >= max(warmup_s, born[m["pid"]] + warmup_s):
            by_pid[m["pid"]].append((m["t"], m["rss_mb"]))
    out = []
    for pid, pts in by_pid.items():
        t, mb = np.array(pts).T
        lived = float(t[-1] - t[0]) if len(t) > 1 else 0.0
        slope = float(np.polyfit(t / 3600, mb, 1)[0]) if len(t) >= 3 and lived > 0 else 0.0
        out.append({"pid": pid, "name": names[pid], "first_mb": float(mb[0]), "last_mb": float(mb[-1]),
                    "max_mb": float(mb.max()), "slope_mb_h": slope, "judged": lived >= (span_s - warmup_s) / 2})
    return sorted(out, key=lambda r: -r["max_mb"])


def plot(mem: list[dict], faults: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5))
    by_pid: dict[int, list[tuple[float, float]]] = defaultdict(list)
    names: dict[int, str] = {}
    for m in mem:
        by_pid[m["pid"]].append((m["t"] / 60, m["rss_mb"]))
        names[m["pid"]] = m["name"]
    for pid, pts in by_pid.items():
        if max(p[1] for p in pts) >= 50:  # small helpers (shells, Ray's tiny daemons) would only crowd the plot
            t, mb = zip(*pts, strict=True)
            ax.plot(t, mb, lw=1, label=f"{names[pid][:28]} ({pid})")
    for f in faults:
        ax.axvline(f["t"] / 60, color="grey", ls=":", lw=0.8)
    ax.set_xlabel("minutes (dotted: a fault)")
    ax.set_ylabel("resident memory (MB)")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def judge(a: Any, run: Path, rc: int, ended_early: bool, resumed: Any, step_times: dict[int, float],
          span_s: float, cpu: str) -> bool:
    out = a.out
    mem, faults = _jsonl(out / "memory.jsonl"), _jsonl(out / "faults.jsonl")
    metrics = _jsonl(out / "metrics_soak.jsonl")  # the soak's run, before the resume
    steps = [r["step"] for r in metrics]
    resumed_rows = _jsonl(run / "metrics.jsonl")
    n = max(step_times, default=0)
    problems = []
    if ended_early:
        problems.append(f"the training process ended on its own (rc {rc}) before the soak's end: see train.log")
    if not steps or steps != list(range(1, len(steps) + 1)):
        problems.append(f"steps are not 1..N without a gap: {steps[:5]}…{steps[-5:]}")
    if resumed.returncode != 0 or not resumed_rows or resumed_rows[-1]["step"] != n + 1:
        problems.append(f"the resume did not train step {n + 1} (rc {resumed.returncode}): "
                        f"{resumed.stderr.strip().splitlines()[-1:] or ''}")
    last = metrics[-1] if metrics else {}
    kinds = Counter(f["kind"] for f in faults)
    killed = Counter(f["kind"] for f in faults if f["pid"] is not None)
    reasons = Counter(json.loads((out / "failures_soak.json").read_text()))
    counted = {"rollout_kill": last.get("cluster/restarts", 0) >= killed["rollout_kill"],
               "env_worker_kill": last.get("cluster/env_restarts", 0) >= killed["env_worker_kill"],
               "env_hang": reasons["timeout"] >= len(list((out / "faults").glob("hung.*"))),
               "connection_drop": kinds["connection_drop"] == 0 or reasons["env_error"] + reasons["reset_error"] > 0}
    problems += [f"{k}: not counted" for k, ok in counted.items() if kinds[k] and not ok]
    unrecovered = [f for f in faults if not any(t > f["t"] for t in step_times.values())]
    problems += [f"{f['kind']} at {f['t'] / 60:.1f} min: no step completed after it" for f in unrecovered]
    warmup_s = a.warmup_min * 60
    procs = slopes(mem, warmup_s, span_s)
    problems += [f"{p['name']} ({p['pid']}) grows {p['slope_mb_h']:.1f} MB/h after warm-up (> {a.max_slope})"
                 for p in procs if p["judged"] and p["slope_mb_h"] > a.max_slope]
    plot(mem, faults, out / "memory.png")
    lines = [f"Soak of {span_s / 3600:.2f} h on {cpu}: `{' '.join(['experiments/soak.py', '--hours', str(a.hours)])}`",
             "", f"**{'PASS' if not problems else 'FAIL'}**" + "".join(f"\n- {p}" for p in problems), "",
             f"Steps completed: {n} (resume trained step {n + 1}: {resumed.returncode == 0}); run stopped with "
             f"SIGINT, rc {rc}.", "", "| fault | injected | hit a process | counted |", "|---|---|---|---|"]
    lines += [f"| {k} | {kinds[k]} | {killed[k] if k.endswith('kill') or k == 'connection_drop' else '—'} | "
              f"{counted[k]} |" for k in counted]
    lines += ["", f"Final counters: cluster/restarts {last.get('cluster/restarts')}, cluster/env_restarts "
                  f"{last.get('cluster/env_restarts')}; failed episodes by reason: {dict(reasons)}.", "",
              f"Memory after {a.warmup_min:g} min of warm-up (slope limit {a.max_slope:g} MB/h; judged: lived at "
              "least half the rest of the run):", "",
              "| process | pid | MB at warm-up | MB at end | max MB | slope MB/h | judged |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {p['name']} | {p['pid']} | {p['first_mb']:.0f} | {p['last_mb']:.0f} | {p['max_mb']:.0f} | "
              f"{p['slope_mb_h']:+.1f} | {p['judged']} |" for p in procs if p["max_mb"] >= 50]
    lines += ["", "![memory](memory.png)"]
    report = "\n".join(lines)
    (out / "report.md").write_text(f"# Soak\n\n{report}\n")
    print(report)
    return not problems
