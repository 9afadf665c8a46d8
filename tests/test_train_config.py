"""Training configs: every shipped config loads; bad keys and values fail with a clear message."""

import re
from pathlib import Path

import pytest

from sleuth.cli.main import main
from sleuth.core.errors import ConfigError
from sleuth.training.config import load_config

ROOT = Path(__file__).resolve().parents[1]
SFT_CONFIGS = sorted((ROOT / "configs").glob("*_sft.yaml")) + sorted((ROOT / "configs").glob("*_rft.yaml"))
CONFIGS = [p for p in sorted((ROOT / "configs").glob("*.yaml")) if p not in SFT_CONFIGS] + \
    [ROOT / "examples" / "sql_env" / "train.yaml"]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_load(path):
    cfg = load_config(path)
    assert cfg.max_steps >= 1


@pytest.mark.parametrize("path", SFT_CONFIGS, ids=lambda p: p.name)
def test_shipped_sft_configs_load(path):
    from sleuth.training.sft.trainer import load_sft_config

    cfg = load_sft_config(path)
    assert cfg.data.source in ("oracle", "rejection", "tool_demos") and re.search(r":train(:\d+)?$", cfg.data.tasks)


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_a_shipped_config_says_what_it_is_in_ten_lines_and_is_listed(path):
    """What it trains, from what, and where its choices are measured: at most 10 comment lines before the first
    setting (measurements live in docs/results.md), and a row in configs/README.md."""
    lines = path.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#"))
    header = [line for line in lines[:first] if line.strip()]
    assert 1 <= len(header) <= 10, f"{path.name}: {len(header)} comment lines before its first setting"
    assert f"| `{path.stem}` |" in (ROOT / "configs" / "README.md").read_text()


def test_overrides_and_types():
    cfg = load_config(overrides={"rollout.group_size": 8, "deepspeed.lr": "1e-5", "deepspeed.lora": {"r": 4}})
    assert cfg.rollout.group_size == 8 and cfg.deepspeed.lr == 1e-5 and cfg.deepspeed.lora.r == 4
    cfg = load_config(overrides={"loss.rollout_is": "tis", "loss.rollout_is_cap": "inf", "update.epochs": 2})
    assert cfg.loss.rollout_is_cap == float("inf") and cfg.update.epochs == 2


@pytest.mark.parametrize("overrides, message", [
    ({"rollout.grup_size": 3}, "did you mean 'group_size'"),
    ({"loss.eps_low": "x"}, "loss.eps_low: expected float"),
    ({"rollout.group_size": 2.5}, "rollout.group_size: expected int"),
    ({"deepspeed.zero_stage": 5}, "zero_stage must be 0, 1, 2 or 3"),
    ({"loss.aggregation": "mean"}, "aggregation must be one of"),
    ({"rollout": 3}, "rollout: expected a mapping"),
    ({"deepspeed.lora.target_modules": "q_proj"}, "expected a list"),
    ({"update.epochs": 0}, "update.epochs and update.mini_batches must be ≥ 1"),
    ({"update.mini_batches": -1}, "update.epochs and update.mini_batches must be ≥ 1"),
    ({"update.old_logprobs": "engine"}, "old_logprobs must be one of recompute, rollout"),
    ({"loss.rollout_is": "tis", "update.old_logprobs": "rollout"}, "rollout_is corrects π_old"),
    ({"loss.rollout_is_cap": 0.9}, "rollout_is_cap must be ≥ 1"),
    ({"loss.kl_coef": -0.1}, "kl_coef and loss.entropy_coef must be ≥ 0"),
    ({"env": "textarena:KuhnPoker-v0", "env_args": {"opponent": "self"}}, "opponent: self .* rollout.inference: vllm"),
])
def test_bad_values_are_named(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=overrides)


def test_bad_files(tmp_path, capsys):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML at line 2, column 1") as e:
        load_config(bad)
    assert "\n" not in str(e.value)  # PyYAML's own message spreads over five lines
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(bad)
    bad.write_text("rolout:\n  group_size: 2\n")
    assert main(["train", "--config", str(bad)]) == 2
    assert "unknown config key 'rolout'" in capsys.readouterr().err


def test_deepspeed_launcher_argument_is_accepted(capsys):
    """The deepspeed launcher calls `sleuth --local_rank=N train ...`."""
    assert main(["--local_rank=0", "plot", "/nonexistent/run"]) == 2
    assert "no metrics" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["train", "sft"])
def test_a_typod_model_is_refused_before_anything_loads(tmp_path, capsys, command):
    import time

    t = time.perf_counter()
    assert main([command, "--out", str(tmp_path / "run"), "--set", "model=smolm2"]) == 2
    err = capsys.readouterr().err
    assert "model 'smolm2' is neither the embedded model" in err and "nothing is downloaded" in err
    assert time.perf_counter() - t < 10  # no download retries against a hub that is not there
    assert not (tmp_path / "run").exists()  # nothing written


@pytest.mark.parametrize(("override", "message"), [
    ("rollout.temperature=-1", "rollout.temperature must be ≥ 0"),  # it used to roll out for minutes
    ("rollout.top_p=5", "rollout.top_p must be in (0, 1]"),
    ("rollout.max_tokens=0", "rollout.max_tokens must be ≥ 1"),
    ("rollout.concurrency=0", "rollout.concurrency must be ≥ 1"),
    ("update.micro_batch_tokens=-4", "update.micro_batch_tokens must be ≥ 1"),
    ("max_steps=0", "max_steps must be ≥ 1"),  # it used to load everything, then crash at the end
    ("env=DocRaed-v0", "cannot build env 'DocRaed-v0'"),
])
def test_train_refuses_bad_values_and_names_before_loading(tmp_path, capsys, override, message):
    assert main(["train", "--out", str(tmp_path / "run"), "--set", override]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("old", ["engine", "rollout.engine", "rollout.env_workers", "cluster.env_workers",
                                 "cluster.env_worker_cpus", "rollout.branches", "rollout.demo_branches",
                                 "rollout.demonstrator", "rollout.demo_tasks"])
def test_a_renamed_key_is_refused_in_one_line_that_names_its_new_name(old, tmp_path, capsys):
    from sleuth.training.config import RENAMED

    with pytest.raises(ConfigError, match=rf"^config key '{re.escape(old)}' was renamed to '{RENAMED[old]}'$"):
        load_config(overrides={old: {"lr": 1e-5} if old == "engine" else 1})
    path = tmp_path / "old.yaml"  # a config file written before the rename, through the command
    head, _, leaf = old.rpartition(".")
    path.write_text(f"{head}:\n  {leaf}: 1\n" if head else "engine:\n  lr: 1.0e-5\n")
    assert main(["train", "--config", str(path), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: config key '{old}' was renamed to '{RENAMED[old]}'"]


def test_the_settings_a_person_holds_are_counted():
    """109 settings before the floor plan (2026-12-07) and after; the rollout section lost the research settings
    (answer branches, demonstration starts: 25 → 21 rollout settings) to a `branches:` section of their own."""
    import dataclasses

    from sleuth.training.config import TrainConfig

    def leaves(cls):
        return [f"{f.name}.{sub}" for f in dataclasses.fields(cls) if dataclasses.is_dataclass(f.default_factory)
                for sub in leaves(f.default_factory)] + \
            [f.name for f in dataclasses.fields(cls) if not dataclasses.is_dataclass(f.default_factory)]

    settings = leaves(TrainConfig)
    per_section = {s: sum(k.startswith(s + ".") for k in settings) for s in ("rollout", "branches", "deepspeed")}
    assert len(settings) == 109 and per_section == {"rollout": 21, "branches": 4, "deepspeed": 10}
