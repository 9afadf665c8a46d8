"""What every benchmark does at the end: print its Markdown report and keep it in runs/bench/."""

from pathlib import Path

OUT = Path("runs/bench")


def train_recipe(model: str, steps: int, overrides: dict) -> tuple:
    """`configs/docread_cigpo.yaml` (make run's RL recipe) from `model` for `steps` steps in this process, with no
    checkpoints or exports kept: (its config, the per-step metrics rows)."""
    import tempfile

    from sleuth.training.config import load_config
    from sleuth.training.rl.trainer import Trainer

    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "docread_cigpo.yaml",
                          {"model": model, "out": out, "max_steps": steps, "checkpoint.every": 0,
                           "checkpoint.export_hf": False, "tensorboard": False, **overrides})
        return cfg, Trainer(cfg, progress=False).train()


def run_arm(script: str, arm: str, args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> dict:
    """One arm of `script` in a fresh process (`script --arm ARM *args`, which prints its result as the last JSON
    line): what it measures (peak memory, one-time set-up) is then that arm's alone."""
    import json
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, script, "--arm", arm, *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    line = next((x for x in reversed(proc.stdout.splitlines()) if x.startswith("{")), None)
    if proc.returncode or line is None:
        raise RuntimeError(f"arm {arm!r} failed:\n{proc.stderr[-3000:]}")
    return json.loads(line)


def publish(name: str, title: str, report: str) -> None:
    print(report)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.md").write_text(f"# {title}\n\n{report}\n")


def threaded_load(call, requests: int, clients: int) -> dict[str, float]:
    """`call(i)` for i < `requests` from `clients` threads at once, as the agent loop's env workers call a
    server: requests/s, p50/p99 latency in ms, p99/p50, errors (a call that raised)."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    latencies: list[float] = []
    errors = 0
    lock = threading.Lock()

    def one(i: int) -> None:
        nonlocal errors
        start = time.perf_counter()
        try:
            call(i)
        except Exception:
            with lock:
                errors += 1
        latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(requests)))
    wall = time.perf_counter() - start
    latencies.sort()
    p50, p99 = 1000 * latencies[len(latencies) // 2], 1000 * latencies[int(0.99 * len(latencies))]
    return {"requests": requests, "clients": clients, "rps": requests / wall, "p50_ms": p50, "p99_ms": p99,
            "tail": p99 / p50, "errors": errors}


def smollm2_update_setup(batch, micro_batch_tokens: int, gradient_checkpointing: bool = False, **update: object):
    """What the update benchmarks measure against: SmolLM2-135M in fp32 on DeepSpeed ZeRO-2 at lr 1e-9 (the
    weights stay put across repeated updates), a `PolicyUpdater` with a PPO loss + entropy bonus at T = 0.8,
    and the trajectories of `batch` (JSONL) with advantages ±1. Returns (updater, trajectories, advantages)."""
    import numpy as np
    import torch

    from sleuth.agents.eval.episodes import load_trajectories
    from sleuth.agents.policies.models import load_causal_lm, resolve_model
    from sleuth.training.rl.losses import LossConfig
    from sleuth.training.rl.update import PolicyUpdater, UpdateConfig
    from sleuth.training.zero import DeepSpeedConfig, build_engine, init_distributed

    init_distributed()
    trajs = load_trajectories(batch)
    advs = [np.full(t.num_policy_tokens, 1.0 if i % 2 else -1.0) for i, t in enumerate(trajs)]
    torch.manual_seed(0)
    model = load_causal_lm(resolve_model("smollm2"), torch.float32)
    model.config.use_cache = False
    cfg = DeepSpeedConfig(zero_stage=2, lr=1e-9, dtype="fp32", gradient_checkpointing=gradient_checkpointing)
    engine = build_engine(model, cfg)
    upd = PolicyUpdater(engine, UpdateConfig(micro_batch_tokens=micro_batch_tokens, **update),  # type: ignore[arg-type]
                        LossConfig(entropy_coef=0.01), 0, temperature=0.8)
    return upd, trajs, advs


def trl_step_clock():
    """A TRL `TrainerCallback` that records each optimiser step's wall and CPU seconds (`walls`, `cpus`)."""
    import time

    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self):
            self.walls: list[float] = []
            self.cpus: list[float] = []

        def on_step_begin(self, args, state, control, **kw):
            self.w, self.c = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kw):
            self.walls.append(time.perf_counter() - self.w)
            self.cpus.append(time.process_time() - self.c)

    return StepClock()
