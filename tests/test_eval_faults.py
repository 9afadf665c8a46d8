"""`sleuth eval` under faults and odd input, through the real command in a subprocess: a killed env server,
two processes on one --out, repeated task ids, identical greedy samples, a prompt over the context."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sleuth.agents.eval.episodes import load_trajectories
from sleuth.core.net import free_port, wait_healthy


def sleuth(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sleuth.cli", *args], capture_output=True, text=True, timeout=timeout)


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sleuth.cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def env_server(port: int) -> subprocess.Popen:
    proc = start("serve", "env", "--env", "sleuth/DocRead-v0", "--port", str(port))
    wait_healthy(f"http://127.0.0.1:{port}", 60)
    return proc


def kill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def wait_for_lines(path: Path, n: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count("\n") >= n:
            return
        time.sleep(0.01)
    raise TimeoutError(f"{path} never reached {n} lines")


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """Failures say one thing on stderr (progress bars aside), never a traceback."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_episodes_cut_by_a_killed_env_server_are_not_scored_and_the_same_command_retries_them(tmp_path):
    port = free_port()
    out = tmp_path / "run"
    cmd = ["eval", "--env", "sleuth/Remote-v0", "--env-arg", f"url=http://127.0.0.1:{port}", "--env-arg",
           "timeout=5", "--env-arg", "retries=1", "--env-arg", "backoff_s=0.05", "--tasks", "hotpotqa:test",
           "--limit", "60", "--policy", "oracle", "--concurrency", "2",
           "--out", str(out)]
    server = env_server(port)
    run = start(*cmd)
    try:
        wait_for_lines(out / "trajectories.jsonl", 3)
        kill(server)
        _, stderr = run.communicate(timeout=240)
    finally:
        if run.poll() is None:
            kill(run)
    assert run.returncode != 0 and "Traceback" not in stderr
    assert "failed" in stderr and "run the same command again to retry them" in stderr
    summary = json.loads((out / "summary.json").read_text())
    trajs = load_trajectories(out / "trajectories.jsonl")
    assert summary["n_failed"] > 0 and summary["n"] + summary["n_failed"] == 60 == len(trajs)
    assert summary["n"] == sum(not t.failed for t in trajs) >= 3
    assert summary["em"] == 1.0  # the oracle's mean over episodes that ran: a failed one is no 0
    server = env_server(port)  # the server is back: the same command finishes the failed episodes only
    try:
        again = sleuth(*cmd)
    finally:
        kill(server)
    assert again.returncode == 0, again.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == 60 and summary["n_failed"] == 0 and summary["em"] == 1.0
    assert summary["retried_failed"] > 0 and len(load_trajectories(out / "trajectories.jsonl")) == 60
    assert len(load_trajectories(out / "failed.jsonl")) == summary["retried_failed"]  # kept, not lost


def test_a_second_process_on_one_out_is_refused_and_a_killed_owner_leaves_no_lock(tmp_path):
    """The first run is held mid-episode (its env server stopped with SIGSTOP), so it owns --out for sure."""
    port = free_port()
    out = tmp_path / "run"
    cmd = ["eval", "--env", "sleuth/Remote-v0", "--env-arg", f"url=http://127.0.0.1:{port}", "--tasks",
           "hotpotqa:test", "--limit", "40", "--policy", "oracle", "--concurrency", "1", "--out", str(out)]
    server = env_server(port)
    first = start(*cmd)
    try:
        wait_for_lines(out / "trajectories.jsonl", 1)
        os.killpg(server.pid, signal.SIGSTOP)  # the first run now waits on its env, holding --out
        second = sleuth(*cmd)
        assert second.returncode != 0
        assert "is in use by pid" in one_error_line(second) and f"pid {first.pid}" in second.stderr
    finally:
        kill(first)  # SIGKILL: the kernel drops the lock with the process
        os.killpg(server.pid, signal.SIGCONT)
    try:
        kept = len(load_trajectories(out / "trajectories.jsonl"))
        again = sleuth(*cmd)
    finally:
        kill(server)
    assert again.returncode == 0, again.stderr
    trajs = load_trajectories(out / "trajectories.jsonl")
    assert kept >= 1 and len({t.task_id for t in trajs}) == len(trajs) == 40
    assert json.loads((out / "summary.json").read_text())["n"] == 40


def test_repeated_task_ids_are_refused_with_the_ids_named_or_deduplicated(tmp_path, data_dir):
    lines = (data_dir / "hotpotqa" / "test.jsonl").read_text().splitlines()[:3]
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join([*lines, lines[1]]) + "\n")
    repeated = json.loads(lines[1])["id"]
    cmd = ["eval", "--tasks", f"hotpotqa:{path}", "--policy", "oracle"]
    refused = sleuth(*cmd, "--out", str(tmp_path / "a"))
    assert refused.returncode == 2 and repeated in one_error_line(refused) and "--dedupe" in refused.stderr
    ok = sleuth(*cmd, "--dedupe", "--out", str(tmp_path / "b"))
    assert ok.returncode == 0, ok.stderr
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["n"] == 3


def test_several_greedy_samples_are_refused(tmp_path):
    proc = sleuth("eval", "--tasks", "hotpotqa:test", "--limit", "2", "--policy", "oracle", "--samples", "4",
                  "--out", str(tmp_path / "run"))
    assert proc.returncode == 2 and "--temperature > 0" in one_error_line(proc)
    assert not (tmp_path / "run").exists()


def test_a_prompt_over_the_context_ends_truncated_and_the_run_goes_on(tmp_path, data_dir, tiny_model_dir):
    """A 2 MB question for an 8k-context model: never prefilled, the episode truncated with its reason."""
    lines = (data_dir / "hotpotqa" / "test.jsonl").read_text().splitlines()[:2]
    huge = json.loads(lines[0])
    huge["id"], huge["question"] = "huge", "Who? " + "word " * 400_000
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps(huge) + "\n" + lines[1] + "\n")
    proc = sleuth("eval", "--tasks", f"hotpotqa:{path}", "--policy", tiny_model_dir, "--harness", "text",
                  "--max-tokens", "4", "--out", str(tmp_path / "run"), timeout=120)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["n"] == 2 and summary["n_failed"] == 0 and summary["n_prompt_too_long"] == 1
    trajs = {t.task_id: t for t in load_trajectories(tmp_path / "run" / "trajectories.jsonl")}
    assert trajs["huge"].stop_reason == "prompt_too_long" and not trajs["huge"].turns
    assert "does not fit the policy's context of 8192" in trajs["huge"].meta["prompt_too_long"]
    assert trajs[json.loads(lines[1])["id"]].turns  # the other task ran
