"""Soak: asynchronous training on Ray for hours under faults injected at random times, with the resident memory of
every process it started sampled throughout.

Run: `.venv/bin/python experiments/soak.py --hours 2 [--out runs/soak] [--model smollm2]`. Writes report.md, memory.png
and the raw samples (memory.jsonl, faults.jsonl) to --out and prints the report; exits 1 when it fails.

What runs: `sleuth train` (configs/docread_quick.yaml, `cluster.backend: ray`, two rollout workers, one env worker,
`rollout.max_staleness: 1`) whose env is `Remote-v0`, each session on an env server (`sleuth serve env`) that the
soak starts and serves experiments/soak_env.py's FaultyDocRead from. Faults, one at a time at exponential intervals
(mean `--fault-every-min`), in turn:
- `rollout_kill`: SIGKILL of a `ray::RolloutWorker` (Ray restarts it; counted in `cluster/restarts`);
- `env_worker_kill`: SIGKILL of the `ray::EnvWorker` (restarted; its sessions' episodes fail; `cluster/env_restarts`);
- `env_hang`: the next env step on the server blocks until its session is closed (the episode fails as `timeout` at
  `rollout.episode_timeout_s`, and its session is closed);
- `connection_drop`: SIGKILL of the env server, restarted on the same port at once (the requests in flight lose
  their connection; their episodes fail as env failures; new sessions reach the new server).
At the end the run is stopped with SIGINT (as Ctrl-C) and resumed for one step.

It passes when every step completed (metrics rows 1..N, no gap, N ≥ 1, the resume continues at N + 1), every fault
is counted (restarts, timeouts, env failures) and followed by a completed step, and no process's resident memory
grows, after `--warmup-min`, faster than `--max-slope` MB/h (a least-squares slope over each process's samples;
processes that lived less than half the run after warm-up are listed, not judged).

Memory is read from /proc (Linux), without a dependency: a process's VmRSS, and the process tree of the soak's
children (Ray's own daemons and workers are descendants of the training process that started Ray)."""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from soak_report import failure_reasons

from sleuth.core.args import bounded
from sleuth.core.machine import cpu_name
from sleuth.core.net import free_port, wait_healthy

ROOT = Path(__file__).resolve().parents[1]
FAULTS = ("rollout_kill", "env_worker_kill", "env_hang", "connection_drop")


def processes() -> dict[int, tuple[int, str]]:
    """Every process: pid → (parent pid, its title: the Ray actor's name, else the command)."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # it ended meanwhile
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        out[int(d.name)] = (ppid, short_name(cmd))
    return out


def short_name(cmd: str) -> str:
    """A process's name for the report: a Ray actor's title, `python -m MODULE ARG`, a script's or program's name."""
    words = cmd.split(" ")
    if words[0].startswith("ray::"):
        return words[0].split(".")[0]  # ray::RolloutWorker.generate while it generates: the actor
    if Path(words[0]).name.startswith("python"):
        words = words[1:]
        while words and words[0] in ("-u", "-B"):
            words = words[1:]
        if words and words[0] == "-m":
            return " ".join(words[1:3])
    return Path(words[0]).name if words else cmd


def descendants(roots: list[int], table: dict[int, tuple[int, str]]) -> list[int]:
    found, frontier = set(), list(roots)
    while frontier:
        pid = frontier.pop()
        if pid in table and pid not in found:
            found.add(pid)
            frontier += [p for p, (pp, _) in table.items() if pp == pid]
    return sorted(found)


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class EnvServer:
    """`sleuth serve env` with the soak's env, restartable on its port."""

    def __init__(self, out: Path, faults: Path):
        self.port, self.out, self.faults = free_port(), out, faults
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        cmd = [sys.executable, "-m", "sleuth.cli", "serve", "env", "--env", "soak_env:FaultyDocRead", "--port",
               str(self.port), "--env-arg", f"fault_dir={self.faults}", "--env-arg", "harness=text"]
        env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT / "bench"), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                     stderr=open(self.out / "env_server.log", "a"))  # noqa: SIM115
        wait_healthy(self.url, timeout_s=120, proc=self.proc)

    def kill_and_restart(self) -> int:
        pid = self.proc.pid
        self.proc.kill()
        self.proc.wait()
        self.start()
        return pid

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


def train_command(out: Path, model: str, url: str, steps: int) -> list[str]:
    sets = {"model": model, "cluster.backend": "ray", "cluster.rollout_workers": 2, "cluster.env_actors": 1,
            "cluster.worker_cpus": 0.5, "cluster.env_actor_cpus": 0.5,
            "rollout.max_staleness": 1, "loss.rollout_is": "tis", "rollout.env_threads": 4, "env": "Remote-v0",
            # the client's request timeout above the episode's deadline: a hung step is caught as `timeout`
            "env_args": f"{{url: '{url}', harness: text, timeout: 300}}", "rollout.max_tokens": 32,
            "rollout.episode_timeout_s": 120, "checkpoint.every": 5, "checkpoint.keep": 2,
            "checkpoint.export_hf": False, "tensorboard": False}
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    return [sys.executable, "-m", "sleuth.cli", "train", "--config", str(ROOT / "configs" / "docread_quick.yaml"),
            "--out", str(out), *args, "--max-steps", str(steps)]


def inject(kind: str, train_pid: int, server: EnvServer, faults: Path) -> int | None:
    """Do fault `kind`; the pid it killed (None when it killed nothing or found no target)."""
    if kind == "env_hang":
        (faults / "hang").touch()
        return None
    if kind == "connection_drop":
        return server.kill_and_restart()
    table = processes()
    title = "ray::RolloutWorker" if kind == "rollout_kill" else "ray::EnvWorker"
    targets = [p for p in descendants([train_pid], table) if table[p][1] == title]
    if not targets:
        return None
    pid = random.choice(targets)
    os.kill(pid, signal.SIGKILL)
    return pid


def rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hours", type=bounded(float, 0.01), default=2.0)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "soak")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--fault-every-min", type=bounded(float, 0.1), default=8.0)
    ap.add_argument("--sample-s", type=bounded(float, 1), default=15.0)
    ap.add_argument("--warmup-min", type=bounded(float, 0), default=20.0)
    ap.add_argument("--max-slope", type=bounded(float, 0), default=50.0, help="MB/h a process may grow after warm-up")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    # SIGINT ends the run at the soak's end; a soak started in a script's background inherits it ignored, and so
    # would the run (Python keeps an inherited SIG_IGN): restored here, so the run's Python handles it again
    signal.signal(signal.SIGINT, signal.default_int_handler)
    rng = random.Random(a.seed)
    a.out.mkdir(parents=True, exist_ok=True)
    faults_dir = a.out / "faults"
    faults_dir.mkdir(exist_ok=True)
    for f in faults_dir.iterdir():
        f.unlink()
    run = a.out / "run"
    mem_log, fault_log = open(a.out / "memory.jsonl", "w"), open(a.out / "faults.jsonl", "w")  # noqa: SIM115
    server = EnvServer(a.out, faults_dir)
    t0 = time.time()
    train = subprocess.Popen(train_command(run, a.model, server.url, 10**6), stdout=subprocess.DEVNULL,
                             stderr=open(a.out / "train.log", "w"), start_new_session=True)  # noqa: SIM115
    end, next_fault, n_fault = t0 + a.hours * 3600, t0 + rng.expovariate(1 / (a.fault_every_min * 60)), 0
    step_times: dict[int, float] = {}
    try:
        while time.time() < end and train.poll() is None:
            now = time.time()
            table = processes()
            for pid in descendants([train.pid, server.proc.pid], table):
                mb = rss_mb(pid)
                if mb is not None:
                    mem_log.write(json.dumps({"t": round(now - t0, 1), "pid": pid, "name": table[pid][1],
                                              "rss_mb": round(mb, 1)}) + "\n")
            mem_log.flush()
            for r in rows(run / "metrics.jsonl"):
                step_times.setdefault(r["step"], round(now - t0, 1))
            if now >= next_fault:
                kind = FAULTS[n_fault % len(FAULTS)]
                pid = inject(kind, train.pid, server, faults_dir)
                fault_log.write(json.dumps({"t": round(now - t0, 1), "kind": kind, "pid": pid}) + "\n")
                fault_log.flush()
                n_fault += 1
                next_fault = now + rng.expovariate(1 / (a.fault_every_min * 60))
            time.sleep(a.sample_s)
        ended_early = train.poll() is not None
        if not ended_early:
            os.killpg(train.pid, signal.SIGINT)
        rc = train.wait(timeout=600)
        for r in rows(run / "metrics.jsonl"):
            step_times.setdefault(r["step"], round(time.time() - t0, 1))
        # what the soak's run recorded, before the resume rewrites the steps after its last checkpoint
        shutil.copy(run / "metrics.jsonl", a.out / "metrics_soak.jsonl")
        (a.out / "failures_soak.json").write_text(json.dumps(failure_reasons(run)))
        resumed = subprocess.run(train_command(run, a.model, server.url, max(step_times, default=0) + 1)
                                 + ["--resume"], capture_output=True, text=True, timeout=1800)
    finally:
        server.close()
        mem_log.close()
        fault_log.close()
    from soak_report import judge

    ok = judge(a, run, rc, ended_early, resumed, step_times, time.time() - t0, cpu_name())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
