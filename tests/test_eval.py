import json

import pytest

from sleuth.agents.eval.episodes import load_trajectories
from sleuth.cli.main import main


def run_eval(out, *extra):
    return main(["eval", "--env", "sleuth/DocRead-v0", "--tasks", "hotpotqa:test", "--out", str(out), *extra])


def test_oracle_scores_em_one_and_writes_a_report(tmp_path):
    assert run_eval(tmp_path, "--policy", "oracle", "--limit", "12") == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["n"] == 12 and summary["em"] == 1.0 and summary["f1"] == 1.0
    assert summary["support_recall"] == 1.0 and summary["mean_reads"] == 2.0 and summary["tool_error_rate_turns"] == 0.0
    assert len(load_trajectories(tmp_path / "trajectories.jsonl")) == 12
    assert "| oracle |" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "report.png").stat().st_size > 10_000


def test_interrupted_run_resumes_without_duplicates(tmp_path):
    assert run_eval(tmp_path, "--policy", "random", "--limit", "6") == 0
    path = tmp_path / "trajectories.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:3]) + "\n" + lines[3][:50])  # as if killed while writing the 4th
    assert run_eval(tmp_path, "--policy", "random", "--limit", "6") == 0
    trajs = load_trajectories(path)
    assert sorted(t.task_id for t in trajs) == sorted(json.loads(x)["task_id"] for x in lines)
    assert json.loads((tmp_path / "summary.json").read_text())["n"] == 6


def test_several_policies_and_harnesses_give_a_comparison(tmp_path, capsys):
    assert run_eval(tmp_path, "--policy", "oracle,first-k", "--harness", "json,text", "--limit", "4") == 0
    assert {p.name for p in tmp_path.iterdir() if p.is_dir()} == {"oracle-json", "oracle-text", "first-k-json",
                                                                  "first-k-text"}
    table = (tmp_path / "comparison.md").read_text()
    assert "| oracle-text | 4 | 1.000 |" in table
    assert "held-out evaluation" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tasks", "nope:test"], "unknown task source"),
        (["--tasks", "hotpotqa:missing_split"], "no split"),
        (["--env", "sleuth/Nope-v0"], "cannot build env"),
        (["--env-arg", "budget=-1"], "budget must be >= 0"),
        (["--env-arg", "colour=blue"], "colour"),
        (["--policy", "/nonexistent/model-dir"], "cannot load policy '/nonexistent/model-dir'"),
        (["--tasks", "musique:{data}/hotpotqa/dev.jsonl"], "not in the MuSiQue layout"),
        (["--tasks", "hotpotqa:{tmp}/broken.jsonl"], "broken.jsonl line 1: not valid JSON"),
    ],
)
def test_bad_input_exits_2_with_a_message(tmp_path, capsys, data_dir, args, message):
    (tmp_path / "broken.jsonl").write_text('{"id": "1", "question": \n')
    args = [a.format(data=data_dir, tmp=tmp_path) for a in args]
    out = tmp_path / "out"
    argv = ["eval", "--tasks", "hotpotqa:test", "--policy", "oracle", "--out", str(out), *args]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (out / "trajectories.jsonl").exists()


def test_envs_command_lists_docread(capsys):
    assert main(["envs"]) == 0
    assert "sleuth/DocRead-v0" in capsys.readouterr().out


@pytest.mark.slow
def test_real_model_eval_writes_a_non_empty_report(tmp_path):
    assert run_eval(tmp_path, "--policy", "smollm2", "--harness", "text", "--limit", "2", "--max-tokens", "24") == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["n"] == 2 and summary["policy_tokens"] > 0 and summary["wall_time_s"] > 0
    trajs = load_trajectories(tmp_path / "trajectories.jsonl")
    assert all(t.turns and t.turns[0].action_text for t in trajs)
    report = (tmp_path / "report.md").read_text()
    assert "## First episodes" in report and "smollm2" in report


def test_title_oracle_reads_by_title_the_named_document_first(tmp_path):
    """`oracle-title` reads the gold documents by title (the question's own entity first) and scores like
    the oracle; its reads resolve to the same documents."""
    assert run_eval(tmp_path, "--policy", "oracle-title", "--harness", "text", "--limit", "8") == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["f1"] == 1.0 and summary["support_recall"] == 1.0 and summary["tool_error_rate_turns"] == 0.0
    from sleuth.tasks import load_tasks, qa_docs

    tasks = {t.id: t for t in load_tasks("hotpotqa:test", limit=8)}
    for t in load_trajectories(tmp_path / "trajectories.jsonl"):
        task = tasks[t.task_id]
        first = t.turns[0]
        assert first.action_text == f"read {first.read.title}" and first.read.gold
        named = [x for x in qa_docs(task).supporting if x.lower() in task.question.lower()]
        if named:
            assert first.read.title in named


def test_resume_refuses_another_runs_directory_and_loses_nothing(tmp_path, capsys):
    """Reusing an --out once reported another run's results as this one's (random "scoring" the oracle's
    1.0). Now the directory records its run and a different one is refused, its episodes untouched."""
    assert run_eval(tmp_path, "--policy", "oracle", "--limit", "3") == 0
    before = (tmp_path / "trajectories.jsonl").read_text()
    capsys.readouterr()
    assert run_eval(tmp_path, "--policy", "random", "--limit", "3") != 0
    err = capsys.readouterr().err
    assert "holds another run's episodes" in err and "'oracle'" in err and "'random'" in err
    assert (tmp_path / "trajectories.jsonl").read_text() == before
    assert main(["eval", "--env", "sleuth/DocRead-v0", "--tasks", "hotpotqa:dev", "--out", str(tmp_path),
                 "--policy", "oracle", "--limit", "3"]) != 0  # another task set
    assert run_eval(tmp_path, "--policy", "oracle", "--limit", "3", "--harness", "text") != 0  # another harness
    assert run_eval(tmp_path, "--policy", "oracle", "--limit", "3") == 0  # the same run resumes
    assert run_eval(tmp_path, "--policy", "random", "--limit", "3", "--no-resume") == 0  # replaced on request
    assert json.loads((tmp_path / "summary.json").read_text())["policy"] == "random"
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "trajectories.jsonl").write_text((tmp_path / "trajectories.jsonl").read_text())
    assert run_eval(legacy, "--policy", "random", "--limit", "3") != 0  # episodes without a recorded run
    assert "unrecorded run" in capsys.readouterr().err


def test_two_models_named_alike_get_their_own_directories(tmp_path, tiny_model_dir):
    import shutil

    for name in ("a", "b"):
        shutil.copytree(tiny_model_dir, tmp_path / name / "hf")
    specs = f"{tmp_path / 'a' / 'hf'},{tmp_path / 'b' / 'hf'}"
    assert run_eval(tmp_path / "out", "--policy", specs, "--harness", "text", "--limit", "1", "--max-tokens", "4") == 0
    assert {p.name for p in (tmp_path / "out").iterdir() if p.is_dir()} == {"a_hf-text", "b_hf-text"}


def test_the_same_weights_exported_again_still_resume(tmp_path, tiny_model_dir):
    """`make run` re-exports a finished model on every run: same weights, same run; other weights, another."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    model_dir = tmp_path / "hf"
    shutil.copytree(tiny_model_dir, model_dir)
    args = ("--policy", str(model_dir), "--harness", "text", "--limit", "1", "--max-tokens", "4")
    assert run_eval(tmp_path / "out", *args) == 0
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.save_pretrained(model_dir)  # written again, same tensors
    assert run_eval(tmp_path / "out", *args) == 0
    with torch.no_grad():
        next(model.parameters()).add_(0.01)
    model.save_pretrained(model_dir)
    assert run_eval(tmp_path / "out", *args) != 0


def test_a_run_where_no_episode_ran_fails_and_says_why(tmp_path, capsys):
    """DocRead on MBPP tasks (no documents) used to exit 0 with n = 0, the errors only in report.md."""
    code = main(["eval", "--env", "sleuth/DocRead-v0", "--tasks", "mbpp", "--limit", "2", "--policy", "oracle",
                 "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code != 0 and "no episode ran (2 failed" in err and "has no payload['docs']" in err
    assert len(load_trajectories(tmp_path / "trajectories.jsonl")) == 2  # the failed episodes are kept


def test_sleuth_evaluate_returns_what_sleuth_eval_prints(tmp_path, capsys):
    """The Python API and the command run the same evaluation: the summary the command prints is the one
    `sleuth.evaluate` returns, and bad input is the same one-line `BadInput`."""
    import sleuth
    from sleuth.core.errors import BadInput

    assert run_eval(tmp_path / "cli", "--policy", "oracle,first-k", "--limit", "3") == 0
    printed = capsys.readouterr().out
    result = sleuth.evaluate("hotpotqa:test", "oracle,first-k", out=tmp_path / "api", limit=3)
    assert [s["run"] for s in result.summaries] == ["oracle-json", "first-k-json"] and not result.failures
    assert result.report == tmp_path / "api" / "comparison.md" and result.report.exists()
    for summary in result.summaries:
        on_disk = json.loads((tmp_path / "cli" / summary["run"] / "summary.json").read_text())
        timing = ("wall_time_s", "episodes_per_min")
        assert {k: v for k, v in summary.items() if k not in timing} == \
            {k: v for k, v in on_disk.items() if k not in timing}
        assert summary["run"] in printed
    with pytest.raises(BadInput, match="cannot build env 'sleuth/Nope-v0'"):
        sleuth.evaluate("hotpotqa:test", "oracle", env="sleuth/Nope-v0", out=tmp_path / "bad", limit=1)
    assert not (tmp_path / "bad").exists()
