"""The ablation harness (experiments/ablate.py): its arm sets, what it changes on an env whose turns carry no read
events, the report it writes from per-question values, and one smoke run end to end on a tiny model."""

import argparse
import functools
import importlib
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


@pytest.fixture(scope="module")
def ablate():
    sys.path.insert(0, str(EXPERIMENTS))  # the script's own imports (ablate_report) are siblings
    try:
        yield importlib.import_module("ablate")
    finally:
        sys.path.remove(str(EXPERIMENTS))


def test_the_issue_set_is_the_default_and_starts_with_grpo(ablate):
    assert ablate.SETUPS["docread"].arms == "issue" and ablate.SETUPS["search"].arms == "search"
    assert ablate.ARMS["issue"] == ["grpo", "info_gain/support", "info_gain/gold_prob@reader", "cw_grpo",
                                    "cw_grpo_adv", "gear_mix"]
    assert ablate.ARMS["search"] == ["grpo", "cw_grpo", "info_gain/support"]
    assert ablate.ARMS["all"] == list(ablate.VARIANTS)


def test_the_reader_arm_is_gold_prob_reading_with_the_given_reader(ablate):
    args = argparse.Namespace(reader="runs/main/lexical-sft/hf", smoke=False, reads=True, start="warm")
    sets = ablate.arm_overrides("info_gain/gold_prob@reader", args)[1::2]
    assert sets == ["algorithm.estimator_args={}", "algorithm.estimator=info_gain",
                    "algorithm.estimator_args={variant: gold_prob}",
                    "algorithm.estimator_args.reader=runs/main/lexical-sft/hf"]  # the reader is set last


def test_arms_that_need_read_events_leave_envs_without_them(ablate):
    """DocRead's `read` and Search's `open` both report read events, so every arm runs on both; on an env
    that reports none the arms that read `Turn.read` go, and cw_grpo judges with its LLM judge."""
    assert ablate.reports_reads("sleuth/DocRead-v0")
    assert ablate.reports_reads("sleuth/Search-v0")
    assert ablate.fit_to_env(ablate.ARMS["search"], reads=True) == (ablate.ARMS["search"], [])
    names, notes = ablate.fit_to_env(ablate.ARMS["search"], reads=False)
    assert names == ["grpo", "cw_grpo"]
    assert "Left out: info_gain/support" in notes[0] and "LLM judge" in notes[1]
    assert ablate.fit_to_env(ablate.ARMS["issue"], reads=True) == (ablate.ARMS["issue"], [])
    args = argparse.Namespace(reader="r", smoke=False, reads=False, start="warm")
    assert "algorithm.estimator_args.judge=llm" in ablate.arm_overrides("cw_grpo", args)
    args.reads = True
    assert "algorithm.estimator_args.judge=llm" not in ablate.arm_overrides("cw_grpo", args)


def fake_row(name: str, f1: float) -> dict:
    questions = {f"q{i}": {"em": 0.0, "f1": f1 + 0.01 * i, "support_recall": 0.5, "tool_error_share": 0.0,
                           "answered": 1.0} for i in range(3)}
    return {"variant": name, "questions": {"dev": questions, "test": questions},
            "cost": {"rollout": 10.0, "reward": 1.0, "update": 20.0}, "reward_curve": [0.1, 0.2],
            "support_curve": [0.3, 0.4]}


def test_the_report_has_one_table_per_held_out_set(ablate, tmp_path):
    from ablate_report import HeldOut

    sets = [HeldOut("dev", "hotpotqa:dev", 3), HeldOut("test", "hotpotqa:test", 3)]
    rows = [fake_row("grpo", 0.2), fake_row("info_gain/support", 0.3)]
    warm = {"dev": fake_row("warm", 0.1)["questions"]["dev"], "test": fake_row("warm", 0.1)["questions"]["test"]}
    args = argparse.Namespace(smoke=False, setup=ablate.SETUPS["docread"], steps=60, episodes=480, sets=sets,
                              names=["grpo", "info_gain/support", "info_gain/gold_prob@reader"], start="warm/hf",
                              reader="warm/hf", set=[], notes=["A note."])
    body = ablate.write(tmp_path, "Estimator ablation", ablate.header(args, tmp_path), rows, warm, sets)
    text = (tmp_path / "ablation.md").read_text()
    assert text.startswith("# Estimator ablation\n") and body in text and (tmp_path / "curves.png").exists()
    assert "480 training episodes each (60 steps)" in body and body.split("\n")[0].endswith("A note.")
    assert "reads with `warm/hf`, the warm start (runs/main/lexical-sft/hf" in body  # no lexical-SFT model here
    dev, test = body.split("## dev: the first 3 questions of `hotpotqa:dev`")[1].split(
        "## test: the first 3 questions of `hotpotqa:test`")
    for table in (dev, test):
        lines = [line for line in table.splitlines() if line.startswith("| ")]
        assert [line.split(" | ")[0] for line in lines] == ["| estimator", "| warm start (no RL)", "| grpo",
                                                           "| info_gain/support"]
        assert "vs grpo" not in lines[2] and "vs warm +0.100" in lines[2]  # F1 0.2 against the warm start's 0.1
        assert "vs grpo +0.100" in lines[3] and lines[3].endswith("| 31 (10 + 1.0 + 20) |")


def smoke(ablate, out: Path, *args: str) -> None:
    """`ablate.py --smoke --out OUT ARGS` through the script's `main` in this process, which saves a process that
    would import torch and transformers again; its trainings and evaluations are `sleuth` subprocesses, as in a
    real run (the script's own entry point and its argument errors are test_bench_args'), each on one thread as
    the suite's other subprocess runs (2 cores shared with another test worker: more threads only spin) and
    stopped after 10 minutes (a hung one fails the test instead of holding the suite)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "argv", ["ablate.py", "--smoke", "--out", str(out), *args])
        mp.setattr(ablate, "subprocess", types.SimpleNamespace(run=functools.partial(subprocess.run, timeout=600)))
        mp.setenv("OMP_NUM_THREADS", "1")
        ablate.main()


def test_a_docread_smoke_starts_from_the_tiny_model_every_reader_reads_with(ablate, tmp_path):
    """On DocRead a smoke run's warm start is the tiny random model itself (Search's is one SFT step of it, run
    end to end below, where the rest of the harness is the same for both envs), and so is every reader."""
    args = argparse.Namespace(smoke=True, env="docread", reader=None)
    assert ablate.warm_start(args, tmp_path, None) == args.reader == str(tmp_path / "tiny")
    assert (tmp_path / "tiny" / "config.json").exists() and not (tmp_path / "warm").exists()


@pytest.mark.long
def test_search_smoke_builds_its_warm_start_and_trains_the_reader_arm(ablate, tmp_path, capsys):
    """End to end on Search (about a minute on 2 cores): the warm start is SFT on Search oracle demonstrations with
    dev held out; the reader arm (a step reward) reads with the given model. The warm start and the arm on dev and
    test, one table per set; `--report` rebuilds it alone. One arm: the others differ only in their `--set`s
    (`arm_overrides`, and which arms an env keeps, `fit_to_env`: tested above), and each arm costs a training and
    two evaluations, each a `sleuth` process."""
    out, arms = tmp_path / "ablate-search", ["info_gain/gold_prob@reader"]
    smoke(ablate, out, "--env", "search", "--only", ",".join(arms))
    assert "Left out" not in capsys.readouterr().err
    warm = yaml.safe_load((out / "warm" / "config.yaml").read_text())["data"]
    assert (warm["env"], warm["demonstrator"], warm["held_out"]) == ("Search-v0", "oracle", ["hotpotqa:dev"])
    for held in ("dev", "test"):
        assert (out / "warm-start" / f"eval-{held}" / "summary.json").exists()
    for arm in arms:
        run = out / arm.replace("/", "-")
        assert all((run / f"eval-{held}" / "summary.json").exists() for held in ("dev", "test"))
        config = yaml.safe_load((run / "config.yaml").read_text())
        assert config["env"] == "Search-v0" and config["model"] == str(out / "warm" / "hf")
        assert config["eval"]["tasks"] == "hotpotqa:dev"  # the trainer's leakage check covers dev
        assert not (run / "checkpoints").exists()  # evaluated: only the HF export stays
    reader_arm = yaml.safe_load((out / "info_gain-gold_prob@reader" / "config.yaml").read_text())
    estimator_args = reader_arm["algorithm"]["estimator_args"]
    assert estimator_args == {**estimator_args, "variant": "gold_prob", "reader": str(out / "tiny")}
    body = (out / "ablation.md").read_text()
    assert body.startswith("# Estimator ablation on Search") and "Left out" not in body
    dev, test = body.split("## dev: the first 2 questions of `hotpotqa:dev`")[1].split(
        "## test: the first 2 questions of `hotpotqa:test`")
    assert all(f"| {arm} |" in table for arm in arms for table in (dev, test))
    (out / "ablation.md").unlink()
    smoke(ablate, out, "--env", "search", "--only", ",".join(arms), "--report")
    assert (out / "ablation.md").read_text() == body
