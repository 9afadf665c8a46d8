"""Preemption: SIGTERM (what SLURM and Kubernetes send before they preempt a job) stops `sleuth train`, `sleuth sft`
and `sleuth eval` as Ctrl-C does. The step in flight finishes and is checkpointed (exit 143), the processes they
started go with them, and `--resume` (eval: the same command) continues as if never stopped. `sleuth train`'s case
is in test_trainer.py, where its run is compared, step for step, with the uninterrupted run the kill tests share.

Signals are real: SIGTERM to the command's own pid only (Kubernetes signals a container's first process), after
which none of its descendants may be left."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from procs import sleuth_here, start_sleuth, wait_for

from sleuth.core.interrupts import HoldUntilStepEnd, Terminated, exit_code, sigterm_as_interrupt
from sleuth.training.metrics import read_metrics

RESUME_LINE = "interrupted: rerun with --resume to continue from the last checkpoint"


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def sigterm_and_wait(proc: subprocess.Popen, log: Path) -> tuple[str, list[str]]:
    """SIGTERM to `proc` alone; its exit code must be 143 and every process it had started gone. Returns its
    stderr and the command lines of the descendants it had when signalled."""
    kids = psutil.Process(proc.pid).children(recursive=True)
    said = [" ".join(p.cmdline()) for p in kids]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 143, log.read_text()[-3000:]
    _, alive = psutil.wait_procs(kids, timeout=10)
    assert not alive, f"left behind: {alive}"
    stderr = log.read_text()
    assert "Traceback" not in stderr, stderr[-3000:]
    return stderr, said


def test_sigterm_is_held_to_the_step_end_and_a_second_one_raises_at_once():
    """The mechanism itself, with real signals to this process."""
    before = signal.getsignal(signal.SIGTERM)
    with sigterm_as_interrupt(), pytest.raises(Terminated) as raised:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises in this thread as soon as the signal arrives
    assert exit_code(raised.value) == 143 and exit_code(KeyboardInterrupt()) == 130
    assert signal.getsignal(signal.SIGTERM) == before  # an in-process caller keeps its own handler
    with sigterm_as_interrupt(), HoldUntilStepEnd() as held:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # held, not raised: the step in flight goes on
        assert held.signum == signal.SIGTERM and held.stop_now(lambda x: x)
        with pytest.raises(Terminated):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        assert isinstance(held.interruption(), Terminated)


def test_sigterm_checkpoints_the_sft_step_in_flight_and_resume_continues_exactly(tiny_model_dir, tmp_path, capfd):
    """After the stop, the resumed run's losses are those of a run never stopped (the data order and the weights
    restored). The resumed and the uninterrupted run run in this process: losses agree to 1e-5 whatever its
    thread count."""
    args = ["--set", f"model={tiny_model_dir}", "--set", "data.task_limit=8", "--set", "batch_size=1",
            "--set", "tensorboard=false", "--set", "checkpoint.export_hf=false", "--set", "checkpoint.every=0",
            "--set", "deepspeed.dtype=fp32"]
    out, ref = tmp_path / "sft", tmp_path / "ref"
    proc = start_sleuth(["sft", "--out", out, *args], tmp_path / "sft.log")
    wait_for(lambda: lines(out / "metrics.jsonl") >= 1, proc)
    stderr, _ = sigterm_and_wait(proc, tmp_path / "sft.log")
    step = int((out / "checkpoints" / "latest").read_text().removeprefix("step-"))
    assert 1 <= step < 8 and lines(out / "metrics.jsonl") == step
    assert f"stopped after step {step}: checkpoint step-{step:06d} written" in stderr
    assert stderr.rstrip().splitlines()[-1] == RESUME_LINE
    run = sleuth_here("sft", "--out", out, *args, "--resume", capfd=capfd)
    assert run.returncode == 0, run.stderr[-3000:]
    run = sleuth_here("sft", "--out", ref, *args, capfd=capfd)
    assert run.returncode == 0, run.stderr[-3000:]
    ours, theirs = read_metrics(out / "metrics.jsonl"), read_metrics(ref / "metrics.jsonl")
    assert [r["step"] for r in ours] == [r["step"] for r in theirs] == list(range(1, 9))
    assert [r["loss/nll"] for r in ours[step:]] == pytest.approx([r["loss/nll"] for r in theirs[step:]], rel=1e-5)


def _bfcl_venv() -> bool:
    from sleuth.envs.families.bfcl import BFCL

    try:
        BFCL.python()
        return True
    except ImportError:
        return False


@pytest.mark.skipif(not _bfcl_venv(), reason="no BFCL venv (make bfcl): the env server eval starts runs there")
def test_sigterm_ends_eval_with_its_env_server_and_the_same_command_resumes(tmp_path, capfd):
    """`bfcl:` envs run in a `sleuth serve env` that eval starts in BFCL's venv, in a session of its own (a signal
    to eval's process group would not reach it): it must go when eval does."""
    out = tmp_path / "eval"
    cmd = ["eval", "--env", "bfcl:multi_turn_base", "--tasks", "bfcl:multi_turn_base:test", "--policy", "oracle",
           "--limit", "6", "--concurrency", "1", "--out", out]
    proc = start_sleuth(cmd, tmp_path / "eval.log")
    wait_for(lambda: lines(out / "trajectories.jsonl") >= 2, proc)
    stderr, kids = sigterm_and_wait(proc, tmp_path / "eval.log")
    assert any("serve env --env bfcl:*" in k for k in kids), kids  # started, and gone
    assert stderr.rstrip().splitlines()[-1] == \
        "interrupted: what finished is kept; run the same command again to resume"
    kept = (out / "trajectories.jsonl").read_text().splitlines()
    kept = [x for x in kept if x.endswith("}")]  # a line cut by the signal is no finished episode
    assert len(kept) >= 2
    run = sleuth_here(*cmd, capfd=capfd)
    assert run.returncode == 0, run.stderr[-3000:]
    now = (out / "trajectories.jsonl").read_text().splitlines()
    assert now[:len(kept)] == kept  # not redone
    ids = [json.loads(x)["task_id"] for x in now]
    assert len(ids) == len(set(ids)) == 6 and json.loads((out / "summary.json").read_text())["n"] == 6
