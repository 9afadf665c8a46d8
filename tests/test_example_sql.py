"""The example plugin in examples/sql_env, installed by `make setup`: found by entry points, evaluated
end to end, and its SQL verifier contained."""

import json

import pytest

import sleuth
from sleuth.cli.main import main
from sleuth.envs.registry import registrations
from sleuth.tasks import load_tasks
from sleuth.verifiers.registry import get_verifier


def call(name, **args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def test_registered_through_entry_points():
    assert registrations()["sqlite/HotpotSQL-v0"].source == "sleuth-sql"
    tasks = load_tasks("hotpot_sql:test")
    assert len(tasks) == 59 and all(t.answer.startswith("SELECT") for t in tasks)


def test_episode_query_and_submit():
    task = load_tasks("hotpot_sql:test", limit=1)[0]
    env = sleuth.make("sqlite/HotpotSQL-v0")
    obs, info = env.reset(options={"task": task})
    assert "CREATE TABLE questions" in obs
    obs, *_ = env.step(call("query", sql="SELECT COUNT(*) FROM questions"))
    assert obs.startswith("1 rows\n1100")
    obs, *_, info = env.step(call("query", sql="SELEC nonsense"))
    assert "error: OperationalError" in obs
    _, reward, terminated, *_ = env.step(call("submit", sql=task.answer))
    assert terminated and reward == 1.0


@pytest.mark.parametrize(
    "sql, score",
    [
        ("SELECT 1", 0.0),
        ("DROP TABLE questions", 0.0),  # read-only copy: an error, and the database is untouched
        ("ATTACH DATABASE '/etc/passwd' AS x", 0.0),
    ],
)
def test_wrong_and_hostile_sql_score_zero(sql, score):
    task = load_tasks("hotpot_sql:test", limit=1)[0]
    assert get_verifier("sql")(task, sql).score == score
    assert get_verifier("sql")(task, task.answer).score == 1.0


def test_oracle_eval_scores_one(tmp_path):
    argv = ["eval", "--env", "sqlite/HotpotSQL-v0", "--tasks", "hotpot_sql:test", "--policy", "oracle",
            "--limit", "6", "--out", str(tmp_path)]
    assert main(argv) == 0
    assert json.loads((tmp_path / "summary.json").read_text())["score"] == 1.0


def test_trains_two_steps_and_evaluates(tiny_model_dir, tmp_path):
    """The example's config trains with the stock `sleuth train` (a tiny model of SmolLM2's architecture
    stands in for speed) and the exported model evaluates with `sleuth eval`."""
    from pathlib import Path

    from sleuth.training.metrics import read_metrics

    config = Path(__file__).resolve().parents[1] / "examples" / "sql_env" / "train.yaml"
    run = tmp_path / "sql"
    assert main(["train", "--config", str(config), "--out", str(run), "--set", f"model={tiny_model_dir}",
                 "--set", "rollout.max_tokens=16", "--set", "rollout.group_size=2", "--set", "tensorboard=false"]) == 0
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2]
    assert (run / "training.png").exists() and (run / "hf" / "config.json").exists()
    assert main(["eval", "--env", "sqlite/HotpotSQL-v0", "--tasks", "hotpot_sql:test", "--limit", "2",
                 "--policy", str(run / "hf"), "--max-tokens", "16", "--out", str(tmp_path / "eval")]) == 0
    assert json.loads((tmp_path / "eval" / "summary.json").read_text())["n"] == 2


def test_sleuth_score_takes_the_plugin_verifier(tmp_path, capsys):
    task = load_tasks("hotpot_sql:test", limit=1)[0]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps({"answer": task.answer, "response": r}) + "\n"
                           for r in (task.answer, "SELECT 1 WHERE 0")))
    assert main(["score", "--verifier", "sql", "--input", str(src), "--out", str(out)]) == 0
    assert [json.loads(x)["score"] for x in out.read_text().splitlines()] == [1.0, 0.0]
    assert main(["score", "--verifier", "sq", "--input", str(src), "--out", str(out)]) == 2
    assert "unknown verifier 'sq' (did you mean 'sql'?)" in capsys.readouterr().err
