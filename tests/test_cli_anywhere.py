"""The `sleuth` command from outside the repository: data and shipped recipes are found from any
directory; mistakes exit non-zero with one line and no traceback (through the real command)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SLEUTH = str(Path(sys.executable).parent / "sleuth")


def run(args, cwd, **env):
    clean = {k: v for k, v in os.environ.items() if k != "SLEUTH_DATA"}
    return subprocess.run([SLEUTH, *args], cwd=cwd, env={**clean, **env}, capture_output=True, text=True, timeout=300)


def test_eval_finds_the_data_from_another_directory(tmp_path):
    r = run(["eval", "--tasks", "hotpotqa:test", "--policy", "oracle", "--limit", "2", "--out", "out"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["n"] == 2


@pytest.mark.parametrize(("args", "message"), [
    (["train", "--config", "docread_cgpo"], "config file docread_cgpo does not exist (did you mean 'docread_cigpo'?)"),
    (["sft", "--config", "nope.yaml"], "recipes: agent_tools_cigpo, agent_tools_grpo, agent_tools_sft, bfcl_grpo"),
    (["eval", "--tasks", "hotpotqa:test", "--policy", "gpt5", "--out", "o"], "unknown policy 'gpt5'"),
    (["eval", "--tasks", "hotpotqa:test", "--concurrency", "0", "--out", "o"], "--concurrency: must be ≥ 1"),
    (["train", "--set", "rollout.temperature=-1"], "rollout.temperature must be ≥ 0"),
])
def test_mistakes_exit_non_zero_with_one_line_from_any_directory(tmp_path, args, message):
    r = run(args, tmp_path)
    assert r.returncode == 2 and message in r.stderr.strip().splitlines()[-1], r.stderr  # the last line says it
    assert "Traceback" not in r.stderr


def test_a_wrong_data_variable_is_named(tmp_path):
    r = run(["eval", "--tasks", "hotpotqa:test", "--policy", "oracle", "--out", "o"], tmp_path,
            SLEUTH_DATA=str(tmp_path / "missing"))
    assert r.returncode == 2 and "SLEUTH_DATA=" in r.stderr and "is not a directory" in r.stderr


def test_a_shipped_recipe_loads_by_name_from_anywhere(tmp_path, monkeypatch):
    from sleuth.training.config import load_config

    monkeypatch.chdir(tmp_path)
    assert load_config("docread_cigpo").algorithm.estimator == "info_gain"
    assert load_config("configs/docread_cigpo.yaml").algorithm.estimator == "info_gain"  # the README's form


def test_adapters_prints_files_that_exist(tmp_path):
    r = run(["adapters", "--path", "verl"], tmp_path)
    assert r.returncode == 0 and Path(r.stdout.strip()).is_file() and r.stdout.strip().endswith("verl.py")


def test_eval_help_lists_every_policy_and_harness(tmp_path):
    out = run(["eval", "--help"], tmp_path).stdout
    assert all(word in out for word in ("noop", "oracle-title", "tags", "text", "json"))


def test_an_unwritable_out_is_one_line(tmp_path):
    r = run(["eval", "--tasks", "hotpotqa:test", "--policy", "oracle", "--limit", "1", "--out", "/proc/sleuth/x"],
            tmp_path)
    assert r.returncode == 2 and "cannot" in r.stderr and "Traceback" not in r.stderr


def test_ctrl_c_exits_130_without_a_traceback_and_keeps_finished_episodes(tmp_path):
    import signal
    import time

    clean = {k: v for k, v in os.environ.items() if k != "SLEUTH_DATA"}
    # 300 tasks × 40 samples (~40 s of oracle episodes): the run outlasts the signal on any machine. SIGINT
    # is reset to its default in the child: a suite started in the background (`nohup`, `cmd &` without job
    # control) inherits it ignored, and Python then never raises KeyboardInterrupt.
    proc = subprocess.Popen([SLEUTH, "eval", "--tasks", "hotpotqa:train", "--policy", "oracle", "--concurrency", "1",
                             "--samples", "40", "--temperature", "0.7", "--out", "out"], cwd=tmp_path, env=clean,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    out = tmp_path / "out" / "trajectories.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (out.exists() and out.read_text().count("\n") >= 3):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err and "interrupted" in err, err
    lines = out.read_text().splitlines()
    assert len(lines) >= 3 and all(json.loads(x)["task_id"] for x in lines)  # whole episodes, none torn


def test_an_unforeseen_failure_is_one_line_and_its_traceback_is_one_variable_away(monkeypatch, capsys):
    """Whatever a command did not foresee still ends in one `error:` line and exit 1."""
    import sleuth.cli.tasks as cli
    from sleuth.cli.main import main

    def broken(args):
        raise TypeError("something nobody planned for\nsecond line")

    monkeypatch.setattr(cli, "cmd_envs", broken)
    monkeypatch.delenv("SLEUTH_TRACEBACK", raising=False)
    assert main(["envs"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: TypeError: something nobody planned for (an unexpected")
    monkeypatch.setenv("SLEUTH_TRACEBACK", "1")
    with pytest.raises(TypeError):
        main(["envs"])


def test_plot_skips_metric_lines_that_are_not_rows(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('[1, 2]\n"text"\n{"no_step": 1}\n')
    r = run(["plot", str(tmp_path)], tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == f"error: no metrics in {tmp_path / 'metrics.jsonl'}"
