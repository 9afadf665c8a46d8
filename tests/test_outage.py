"""A transient outage: every env server of a training run is lost at once (SIGKILLed for real) and comes back on
the same port a few seconds later. The step whose every episode failed is sampled again after a backoff
(`rollout.outage_retries`, `rollout.outage_backoff_s`) instead of ending the run, and the retries are counted."""

import json
import os
import signal
import subprocess
import sys

from procs import sleuth_here, wait_for

from sleuth.core.net import free_port, wait_healthy
from sleuth.training.metrics import read_metrics
from sleuth.training.zero import DIST_VARS

ENV = {k: v for k, v in os.environ.items() if k not in DIST_VARS} | {"OMP_NUM_THREADS": "1"}


def sleuth(*args: object, log=subprocess.DEVNULL) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sleuth.cli", *map(str, args)], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)


def env_server(port: int) -> subprocess.Popen:
    proc = sleuth("serve", "env", "--env", "sleuth/DocRead-v0", "--port", port)
    wait_healthy(f"http://127.0.0.1:{port}", 60, proc)
    return proc


def test_a_step_that_lost_every_env_server_is_sampled_again_and_a_signal_in_the_wait_checkpoints_before_it(
        tiny_model_dir, tmp_path, capfd):
    """Two outages. The first: the server comes back within the backoff, the step is sampled again and trains,
    counted. The second: SIGTERM while the step waits; the step is abandoned, the checkpoint written
    (`checkpoint.every=0`: only a stop writes one) is of the step before it as it stood when the step began, so
    the resumed run (in this process: seconds, not a new interpreter's startup) draws the very tasks the abandoned
    step had drawn first."""
    from sleuth.training.config import load_config
    from sleuth.training.rl.task_order import TaskSampler
    from sleuth.training.run import training_tasks

    port = free_port()
    out, log = tmp_path / "run", tmp_path / "train.log"
    url = f"http://127.0.0.1:{port}"
    args = ["train", "--out", out, "--set", f"model={tiny_model_dir}", "--set", "env=sleuth/Remote-v0",
            "--set", f"env_args={{url: '{url}', harness: text, timeout: 5, retries: 0}}", "--set", "task_limit=24",
            "--set", "rollout.max_tokens=12", "--set", "rollout.group_size=2", "--set", "checkpoint.export_hf=false",
            "--set", "tensorboard=false", "--set", "deepspeed.dtype=fp32", "--set", "checkpoint.every=0",
            "--set", "rollout.outage_retries=4", "--set", "rollout.outage_backoff_s=2", "--max-steps", "4"]
    server = env_server(port)
    train = sleuth(*args, log=open(log, "w"))  # noqa: SIM115

    def outage_rows() -> list:
        return [r for r in read_metrics(out / "metrics.jsonl") if r["outage/retries"]]

    try:
        wait_for(lambda: len(read_metrics(out / "metrics.jsonl")) >= 1, train)  # step 1 trained
        os.killpg(server.pid, signal.SIGKILL)  # every env worker of the run, at once
        server.wait(10)
        wait_for(lambda: log.read_text().count("sampling the step again in 2s (retry 1 of") == 1, train)
        server = env_server(port)  # back, on the same port, within the backoff's doubling
        wait_for(lambda: outage_rows(), train)
        os.killpg(server.pid, signal.SIGKILL)  # the second outage
        server.wait(10)
        wait_for(lambda: log.read_text().count("sampling the step again in 2s (retry 1 of") == 2, train)
        train.send_signal(signal.SIGTERM)
        assert train.wait(timeout=120) == 143, log.read_text()[-3000:]
        stopped = len(read_metrics(out / "metrics.jsonl"))  # the steps that finished
        assert f"stopped in step {stopped + 1}'s outage: the last checkpoint is step-{stopped:06d}" in log.read_text()
        assert (out / "checkpoints" / "latest").read_text() == f"step-{stopped:06d}"
        server = env_server(port)
        resumed = sleuth_here(*args, "--resume", capfd=capfd)
    finally:
        for proc in (train, server):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Traceback" not in log.read_text()
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    [hit] = [r for r in rows if r["outage/retries"]]  # the first outage's step (the second's was abandoned)
    assert hit["outage/failed_episodes"] >= 4 and hit["outage/wait_s"] >= 2  # the dropped attempts, not trained
    assert hit["episodes/failed"] < hit["episodes/sampled"]  # the attempt it trained on ran
    # the data order: every step draws tasks_per_step tasks, an outage's step once more per retry
    sampler = TaskSampler(24, 0)
    for _ in range(stopped + hit["outage/retries"]):
        sampler.take(2)
    tasks = training_tasks(load_config(overrides={"task_limit": 24, "env": "sleuth/Remote-v0"}))
    want = sorted(tasks[i].id for i in sampler.take(2) for _ in range(2))
    resumed_step = stopped + 1
    got = sorted(json.loads(x)["task_id"]
                 for x in (out / "rollouts" / f"step-{resumed_step:06d}.rank0.jsonl").read_text().splitlines())
    assert got == want
