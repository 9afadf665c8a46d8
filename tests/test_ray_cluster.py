"""`cluster.backend: ray` on a local Ray cluster (CPU): rollout workers placed as actors, the weight sync
verified on each, a worker SIGKILLed from outside restarted with the current weights while training goes on."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from procs import Watched, sleuth_here

from sleuth.core.errors import ConfigError
from sleuth.training.cluster.placement import ClusterConfig
from sleuth.training.config import load_config
from sleuth.training.zero import DIST_VARS

ray = pytest.importorskip("ray")


def test_cluster_config_is_checked():
    assert ClusterConfig().backend == "local"
    with pytest.raises(ValueError, match="cluster.backend must be one of local, ray"):
        ClusterConfig(backend="slurm")
    with pytest.raises(ValueError, match="set cluster.backend: ray"):
        ClusterConfig(rollout_workers=2)
    with pytest.raises(ValueError, match="cluster.max_restarts must be ≥ 0"):
        ClusterConfig(backend="ray", max_restarts=-1)
    with pytest.raises(ConfigError, match="places its own vLLM engines"):
        load_config(overrides={"cluster.backend": "ray", "rollout.inference": "vllm", "rollout.vllm_url": "http://x:1"})
    with pytest.raises(ConfigError, match="sync_transport: collective syncs Ray rollout workers"):
        load_config(overrides={"update.sync_transport": "collective"})


def _args(tiny_model_dir, out, steps):
    return ["train", "--config", "configs/docread_quick.yaml", "--out", str(out), "--max-steps", str(steps),
            "--set", f"model={tiny_model_dir}", "--set", "task_limit=24", "--set", "rollout.max_tokens=12",
            "--set", "rollout.group_size=2", "--set", "checkpoint.export_hf=false", "--set", "tensorboard=false",
            "--set", "loss.entropy_coef=0.01", "--set", "deepspeed.lr=1e-3", "--set", "rollout.temperature=0.7",
            "--set", "cluster.backend=ray", "--set", "cluster.rollout_workers=2", "--set", "cluster.worker_cpus=0.5",
            "--set", "cluster.env_actors=1", "--set", "cluster.env_actor_cpus=0.5", "--set", "rollout.env_threads=2"]


@pytest.mark.long
def test_train_on_ray_survives_killed_workers_and_a_killed_trainer(tiny_model_dir, tmp_path):
    """The issue's acceptance run, on the tiny model: 3 steps with 2 rollout workers and 1 env worker on a local Ray
    cluster. The training process (the Ray driver) is SIGKILLed after its first checkpoint: its workers and the
    local Ray it started go with it, and `--resume` continues from that checkpoint. After the resumed run's first step
    one `ray::RolloutWorker` and the `ray::EnvWorker` are SIGKILLed from outside: Ray restarts them, the trainer
    reloads and verifies the rollout worker's weights, episodes that lost their env session fail (not scored), and
    the run ends with rc 0, every step logged once, `cluster/restarts` ≥ 1, `cluster/env_restarts` ≥ 1 and its
    workers (and its Ray) gone. Both faults in one run: each start of a run costs a Ray and its workers."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS} | {"OMP_NUM_THREADS": "1"}
    teacher = ["--set", "algorithm.distill.teacher=self", "--set", "algorithm.distill.teacher_context=answer"]
    cmd = [sys.executable, "-m", "sleuth.cli", *_args(tiny_model_dir, out, 3), *teacher]
    run = Watched(cmd, tmp_path / "log", cwd=root, env=env)
    deadline = time.time() + 300
    while time.time() < deadline and run.proc.poll() is None and not (out / "checkpoints" / "latest").exists():
        run.look()
        time.sleep(0.2)
    assert run.proc.poll() is None and run.look("ray::RolloutWorker"), "the run ended before its first checkpoint"
    run.proc.kill()
    run.proc.wait()
    # Ray's own agents find their raylet gone by polling and exit on their own (~1.5 min here); they hold no model
    assert not run.left(besides=("ray::DashboardAgent", "ray::RuntimeEnvAgent"))
    metrics = out / "metrics.jsonl"
    resumed = Watched([*cmd, "--resume"], tmp_path / "resumed.log", cwd=root, env=env)
    # the kill lands while step 3 runs or before it starts: either way the worker is found dead (a call fails or
    # its pid changed at the next sync) and counted
    killed = None
    deadline = time.time() + 300
    while time.time() < deadline and resumed.proc.poll() is None:
        if "resumed" in resumed.output() and '{"step": 2,' in metrics.read_text():
            pids, envs = resumed.look("ray::RolloutWorker"), resumed.look("ray::EnvWorker")
            if len(pids) == 2 and len(envs) == 1:
                killed = pids[0]
                os.kill(killed, signal.SIGKILL)
                os.kill(envs[0], signal.SIGKILL)
                break
        time.sleep(0.2)
    assert resumed.wait(600) == 0, resumed.output()[-3000:]
    assert killed is not None, "the run did not resume, or its first step never finished with two workers up"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]  # the resumed run's log is cut back to its checkpoint, and goes on
    assert rows[-1]["cluster/restarts"] >= 1 and rows[-1]["cluster/live_workers"] == 2
    assert rows[-1]["cluster/env_restarts"] >= 1 and rows[0]["cluster/env_restarts"] == 0
    assert sum(r["episodes/failed"] for r in rows) <= 4  # at most the episodes whose env session was lost
    assert all(r["sync/max_logit_diff"] <= 1e-3 for r in rows)
    assert rows[0]["cluster/restarts"] == 0
    assert all(r["distill/signal_share"] == 1.0 and r["distill/reverse_kl"] != 0 for r in rows)  # the Ray episodes
    assert not resumed.left()  # the run's end takes its workers (and its Ray) down


def test_eval_on_ray_gives_the_local_results(tiny_model_dir, tmp_path, capfd):
    """`sleuth eval --cluster ray`: the episodes spread over two rollout workers come out token for token as
    the local engine's (greedy; the local run in this process, on one thread as each worker), and the run ends with
    the workers gone."""
    from sleuth.agents.eval.episodes import load_trajectories

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS} | {"OMP_NUM_THREADS": "1"}
    common = ["eval", "--env", "sleuth/DocRead-v0", "--tasks", "hotpotqa:test", "--limit", "6", "--harness", "text",
              "--max-tokens", "8", "--policy", str(tiny_model_dir)]
    local = sleuth_here(*common, "--out", tmp_path / "local", capfd=capfd, threads=1)
    assert local.returncode == 0, local.stderr[-3000:]
    done = Watched([sys.executable, "-m", "sleuth.cli", *common, "--out", str(tmp_path / "ray"), "--cluster", "ray",
                    "--rollout-workers", "2"], tmp_path / "ray.log", cwd=root, env=env)
    assert done.wait(600) == 0, done.output()[-3000:]
    assert not done.left()
    runs = {name: {t.task_id: t for t in load_trajectories(tmp_path / name / "trajectories.jsonl")}
            for name in ("local", "ray")}
    assert set(runs["ray"]) == set(runs["local"]) and len(runs["ray"]) == 6
    for task_id, t in runs["local"].items():
        assert runs["ray"][task_id].token_ids() == t.token_ids()


@pytest.mark.long
def test_train_ranks_as_ray_actors_and_a_dead_rank(tiny_model_dir, tmp_path):
    """`cluster.train_ranks: 2`: two DeepSpeed ranks in `ray::TrainRank` actors (gloo inside the actors), each
    with one rollout worker. One rank SIGKILLed from outside after the first checkpoint ends the run in one
    line naming it and `--resume`; the resumed run finishes every step (2: one before the kill, one after)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS} | {"OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "sleuth.cli", "train", "--config", "configs/docread_quick.yaml", "--out", str(out),
           "--max-steps", "2", "--set", f"model={tiny_model_dir}", "--set", "task_limit=24",
           "--set", "rollout.max_tokens=12", "--set", "rollout.group_size=2", "--set", "checkpoint.export_hf=false",
           "--set", "tensorboard=false", "--set", "loss.entropy_coef=0.01", "--set", "deepspeed.lr=1e-3",
           "--set", "cluster.backend=ray", "--set", "cluster.train_ranks=2", "--set", "cluster.train_cpus=0.5",
           "--set", "cluster.worker_cpus=0.5"]
    run = Watched(cmd, tmp_path / "log", cwd=root, env=env)
    deadline = time.time() + 300
    while time.time() < deadline and run.proc.poll() is None and not (out / "checkpoints" / "latest").exists():
        run.look()
        time.sleep(0.2)
    ranks = run.look("ray::TrainRank")
    assert run.proc.poll() is None and len(ranks) == 2, "the run ended before its first checkpoint"
    os.kill(ranks[-1], signal.SIGKILL)
    assert run.wait(300) != 0
    line = [x for x in run.output().splitlines() if x.startswith("error:")][-1]
    assert "train rank" in line and "died" in line and "--resume" in line
    assert not run.left()
    done = subprocess.run([*cmd, "--resume"], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]  # the resumed run's log is cut back to its checkpoint, and goes on


@pytest.mark.usefixtures("local_ray")
@pytest.mark.parametrize("transport", ["object_store", "collective"])
def test_a_hung_worker_fails_the_sync_naming_it(tiny_model_dir, transport):
    """A worker that stops answering (SIGSTOP: alive, not dead, so Ray does not restart it) makes the weight
    sync fail after `rollout.sync_timeout_s` with `WeightSyncError` naming that worker — not hang."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sleuth.agents.chat import ChatRenderer
    from sleuth.training.cluster.rollout_engine import RayRollout
    from sleuth.training.rollout.in_process import WeightSyncError
    from sleuth.training.run import PROBE

    cfg = load_config(overrides={"cluster.backend": "ray", "cluster.rollout_workers": 2,
                                 "rollout.sync_timeout_s": 5.0, "update.sync_transport": transport})
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    probe = ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir)).prompt_ids(PROBE)
    rollout = RayRollout(cfg.rollout, cfg.cluster, cfg.update, tiny_model_dir, torch.float32, probe)
    hung = rollout.pool.handles[1]
    try:
        os.kill(hung.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(WeightSyncError, match="rollout-worker-1"):
            rollout.sync(model)
        assert time.monotonic() - t0 < 30
    finally:
        os.kill(hung.pid, signal.SIGCONT)
        rollout.close()
