"""Sleuth's Ray path: `sleuth train` with one TrainRank actor and one RolloutWorker actor (sharing the GPU),
the worker SIGKILLed from outside after the first step, as tests/test_ray_cluster.py does on the CPU; the same
with the weights over the collective group (`ray_collective`) and with a vLLM engine as the worker (`ray_vllm`,
skipped in one line where no vLLM Python is installed)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpucheck.base import REPO, T0, Check, Report, State

STEPS = 3
GPU_CAP_S = 180.0  # on a GPU the run is stopped after this long: a lent machine's minutes are few
KINDS = ("RolloutWorker", "TrainRank")  # the actors that hold a model (GPU memory when on a GPU)


def _ray_actors(root: int) -> dict[int, str]:
    """{pid: kind} of the KINDS actor processes descending from `root` (the run's own Ray, started by its
    driver): never a process of another Ray on the machine."""
    parent: dict[int, int] = {}
    kind: dict[int, str] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (d / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, IndexError, ValueError):  # gone while scanned
            continue
        for k in KINDS:
            if cmd.startswith(f"ray::{k}"):
                kind[int(d.name)] = k
    out = {}
    for pid, k in kind.items():
        p = pid
        while p > 1 and p != root:
            p = parent.get(p, 0)
        if p == root:
            out[pid] = k
    return out


def _alive_actor(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::")
    except OSError:
        return False


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    vals = [r[key] for r in rows if key in r]
    return round(sum(vals) / len(vals), 3) if vals else math.nan


def check_ray(rep: Report, st: State) -> None:
    """`sleuth train` (configs/docread_quick.yaml, the tiny model, 3 steps) with `cluster.backend=ray`, one
    train rank and one rollout worker (0.5 GPU each; on the CPU smoke 0.5 CPU each), in a subprocess; after
    the first step's metrics row the worker is SIGKILLed. PASS: rc 0, 3 rows, `cluster/restarts` ≥ 1, one
    live worker, every `sync/max_logit_diff` within the config's `update.sync_tolerance`, no actor left."""
    _ray_run(rep, st, "ray", [])


def check_ray_collective(rep: Report, st: State) -> None:
    """`check_ray` with `update.sync_transport=collective` (gloo between processes sharing a GPU: NCCL needs a GPU
    per rank): every sync reports its bytes/s."""
    _ray_run(rep, st, "ray_collective", ["update.sync_transport=collective", "update.sync_bucket_mb=64"])


def check_ray_vllm(rep: Report, st: State) -> None:
    """`check_ray` with `rollout.inference=vllm`: the worker is a supervised vLLM server (its logprobs verified
    within `update.sync_tolerance_vllm`); skipped in one line without a vLLM Python."""
    from sleuth.training.rollout.vllm_servers import default_vllm_python

    if default_vllm_python() is None:
        with Check(rep, "ray_vllm", 0) as c:
            c.skip = "no vLLM Python on this machine (make vllm builds .venv-vllm, or set $SLEUTH_VLLM_PYTHON)"
        return
    _ray_run(rep, st, "ray_vllm", ["rollout.inference=vllm", "update.sync_transport=collective"])


def _ray_run(rep: Report, st: State, name: str, extra: list[str]) -> None:
    with Check(rep, name, 90) as c:
        c.check_skip()
        try:
            import ray
        except ImportError as e:
            c.skip = f"ray is not importable ({e})"
            return
        from sleuth.core.args import parse_kv
        from sleuth.training.config import load_config
        from sleuth.training.zero import DIST_VARS

        c.figures["ray"] = ray.__version__
        if st.tiny_dir is None:  # the models check did not run (--only) or failed
            from sleuth.agents.policies.models import tiny_model

            st.tiny_dir = tiny_model(st.work / "tiny", like=str(st.tok_dir))
        gpu = not st.args.cpu_smoke
        share = ("train_gpus", "worker_gpus") if gpu else ("train_cpus", "worker_cpus")
        shares = [f"cluster.{k}=0.5" for k in share]
        sets = [f"model={st.tiny_dir}", f"tasks={st.tasks_spec}", "task_limit=24",
                f"rollout.max_tokens={st.sz['trainer_max_tokens']}",
                f"rollout.group_size={st.sz['trainer_group']}",
                "checkpoint.export_hf=false", "tensorboard=false", "loss.entropy_coef=0.01", "deepspeed.lr=1e-3",
                "cluster.backend=ray", "cluster.train_ranks=1", "cluster.rollout_workers=1", *shares, *extra]
        c.figures["shares"] = ", ".join(s.removeprefix("cluster.") for s in shares)
        out, base = st.work / f"train-{name}", REPO / "configs" / "docread_quick.yaml"
        # the tolerance the run's trainer verifies each sync against, read as `sleuth train` reads its config
        cfg = load_config(base, parse_kv(sets, flag="--set") | {"out": str(out), "max_steps": STEPS})
        vllm = cfg.rollout.inference == "vllm"
        tol, diff_key = ((cfg.update.sync_tolerance_vllm, "sync/max_logprob_diff") if vllm
                         else (cfg.update.sync_tolerance, "sync/max_logit_diff"))
        c.figures["sync_tolerance"] = tol
        left = st.args.budget_s - (time.time() - T0) - 10  # ends before the budget's hard stop
        timeout = min(left, GPU_CAP_S) if gpu else left
        cmd = [sys.executable, "-m", "sleuth.cli", "train", "--config", str(base), "--out", str(out),
               "--max-steps", str(STEPS), *[a for s in sets for a in ("--set", s)]]
        env = {k: v for k, v in os.environ.items() if k not in DIST_VARS} | {"OMP_NUM_THREADS": "1"}
        log = st.work / f"train-{name}.log"
        c.figures["log"] = str(log)
        metrics = out / "metrics.jsonl"
        seen: dict[int, str] = {}
        killed = None
        t = time.perf_counter()
        with log.open("w") as f:
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        try:
            while proc.poll() is None and time.perf_counter() - t < timeout:
                actors = _ray_actors(proc.pid)
                seen |= actors
                workers = [p for p, k in actors.items() if k == "RolloutWorker"]
                if killed is None and len(workers) == 1 and metrics.exists() and metrics.stat().st_size:
                    os.kill(workers[0], signal.SIGKILL)  # step 1's metrics row is written
                    killed = workers[0]
                    c.figures["killed_after_s"] = round(time.perf_counter() - t, 1)
                time.sleep(0.2)
        finally:
            if proc.poll() is None:  # out of time, or this loop raised
                os.killpg(proc.pid, signal.SIGKILL)  # the driver's session: the run's Ray goes with it
                proc.wait()
                c.fail.append(f"the run was stopped after {time.perf_counter() - t:.0f} s "
                              f"(limit {timeout:.0f} s)")
        c.figures["wall_s"] = round(time.perf_counter() - t, 1)
        tail = log.read_text(errors="replace").strip().splitlines()[-40:]
        err = next((x for x in reversed(tail) if x.startswith("error:")), tail[-1] if tail else "no output")
        c.need(proc.returncode == 0, f"rc {proc.returncode}: {err[:300]}")
        c.need(killed is not None, "no ray::RolloutWorker of the run was found to kill after step 1")
        gone = time.time() + 10
        while any(_alive_actor(p) for p in seen) and time.time() < gone:
            time.sleep(0.5)
        left_over = [p for p in seen if _alive_actor(p)]
        c.need(not left_over, f"actor processes {left_over} outlived the run (SIGKILLed now)")
        for p in left_over:
            os.kill(p, signal.SIGKILL)
        rows = _rows(metrics)
        c.figures["steps"] = len(rows)
        c.need([r.get("step") for r in rows] == list(range(1, STEPS + 1)),
               f"metrics rows for steps {[r.get('step') for r in rows]}, not 1..{STEPS}")
        for key in ("time/rollout", "time/update", "time/sync"):
            c.figures[f"{key.split('/')[1]}_s_mean"] = _mean(rows, key)
        diffs = [r.get(diff_key, math.inf) for r in rows]
        c.figures[diff_key.replace("/", "_")] = max(diffs, default=math.nan)
        c.need(bool(diffs) and all(d <= tol for d in diffs), f"sync diffs {diffs} not all within {tol}")
        if "update.sync_transport=collective" in extra:
            rates = [r.get("sync/bytes_per_s", 0.0) for r in rows]
            c.figures["sync_mb_per_s_mean"] = round(sum(rates) / max(len(rates), 1) / 2**20, 1)
            c.need(all(x > 0 for x in rates), "a sync without sync/bytes_per_s: not the collective path")
        last = rows[-1] if rows else {}
        restarts, live = last.get("cluster/restarts"), last.get("cluster/live_workers")
        c.figures["restarts"], c.figures["live_workers"] = restarts, live
        c.need((restarts or 0) >= 1, f"cluster/restarts {restarts} (want >= 1)")
        c.need(live == 1, f"cluster/live_workers {live} (want 1)")
        c.table = ["| step | rollout s | update s | sync s | sync diff | restarts | live workers |",
                   "|---|---|---|---|---|---|---|"]
        c.table += [f"| {r.get('step')} | {r.get('time/rollout', math.nan):.2f} | "
                    f"{r.get('time/update', math.nan):.2f} | {r.get('time/sync', math.nan):.2f} | "
                    f"{r.get(diff_key, math.nan):.2e} | {r.get('cluster/restarts')} | "
                    f"{r.get('cluster/live_workers')} |" for r in rows]
        if c.fail:
            print("    the run's last lines:\n      " + "\n      ".join(tail), flush=True)
