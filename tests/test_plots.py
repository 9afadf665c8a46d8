"""Report plots: zero values visible, legends beside the bars, integer steps, refused empty comparisons."""

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def figures(monkeypatch):
    """The figures the plotting code closes, kept for inspection."""
    kept = []
    monkeypatch.setattr(plt, "close", lambda fig=None: kept.append(fig))
    return kept


def test_comparison_bars_label_zero_values_and_keep_the_legend_outside(tmp_path, figures):
    from sleuth.agents.eval.report import write_comparison

    rows = [{"run": "a", "policy": "a", "n": 2, "score": 0.0, "em": 0.0, "f1": 0.0, "support_recall": 0.5},
            {"run": "b", "policy": "b", "n": 2, "score": 1.0, "em": 1.0, "f1": 1.0, "support_recall": 1.0}]
    write_comparison(tmp_path, rows)
    ax = figures[-1].axes[0]
    labels = [t.get_text() for t in ax.texts]
    assert labels.count("0.00") >= 2  # the two zero bars of run a carry a visible label
    legend = ax.get_legend()
    assert legend._bbox_to_anchor is not None and legend._bbox_to_anchor.x0 > ax.bbox.x1 - 1


def test_a_one_step_training_plot_has_integer_steps(tmp_path, figures):
    from sleuth.training.metrics import plot_run

    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5, "loss/policy": 0.1}) + "\n")
    plot_run(tmp_path)
    low, high = figures[-1].axes[0].get_xlim()
    assert low <= 0 and high >= 2  # not 0.96 … 1.04


def test_compare_with_no_shared_tasks_exits_non_zero(tmp_path, capsys):
    from sleuth.cli.main import main

    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["eval", "--tasks", "hotpotqa:test", "--policy", "oracle", "--limit", "2", "--out", str(a)]) == 0
    assert main(["eval", "--tasks", "hotpotqa:dev", "--policy", "oracle", "--limit", "2", "--out", str(b)]) == 0
    capsys.readouterr()
    assert main(["compare", str(a), str(b)]) == 2
    assert "share no task" in capsys.readouterr().err


def test_wandb_offline_run_holds_the_metrics_and_resume_continues_it(tmp_path, monkeypatch):
    import glob
    from pathlib import Path

    from sleuth.training.metrics import MetricsLogger, WandbConfig

    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = WandbConfig(project="sleuth-test", mode="offline")
    log = MetricsLogger(tmp_path, tensorboard=False, wandb=cfg, config={"lr": 1e-5})
    log.log(1, {"reward/mean": 0.25, "note": "text is not a scalar"})
    log.log(2, {"reward/mean": 0.5})
    assert log.wandb.summary["reward/mean"] == 0.5 and "note" not in log.wandb.summary.keys()
    log.close()
    run_id = (tmp_path / "wandb" / "run-id").read_text()
    runs = glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
    assert len(runs) == 1 and runs[0].endswith(run_id)  # `wandb sync` uploads this directory later
    assert (Path(runs[0]) / f"run-{run_id}.wandb").stat().st_size > 0
    again = MetricsLogger(tmp_path, resume_step=2, tensorboard=False, wandb=cfg)
    assert again.wandb.id == run_id  # the same W&B run, continued
    again.close()


def test_wandb_is_off_unless_a_project_is_named(tmp_path, monkeypatch):
    from sleuth.training.metrics import MetricsLogger, WandbConfig

    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    assert MetricsLogger(tmp_path, tensorboard=False, wandb=WandbConfig()).wandb is None
    with pytest.raises(ValueError, match="wandb.mode"):
        WandbConfig(project="p", mode="cloud")
