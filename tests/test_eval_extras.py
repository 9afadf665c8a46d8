import json

import pytest

from sleuth.agents.eval.breakdown import breakdown, pass_at_k, pass_at_ks
from sleuth.agents.eval.compare import bootstrap_ci, compare
from sleuth.agents.trajectory import Trajectory
from sleuth.cli.main import main
from sleuth.tasks import Task
from sleuth.verifiers.base import Verdict


def traj(task_id, score, **details):
    return Trajectory(task_id, "env", [], verdict=Verdict(score, details), terminated=True)


@pytest.mark.parametrize("n, c, k, expected", [(5, 2, 2, 1 - 3 / 10), (4, 1, 1, 0.25), (3, 0, 1, 0.0),
                                               (3, 3, 1, 1.0), (5, 4, 2, 1.0), (10, 3, 5, 1 - 21 / 252)])
def test_pass_at_k_unbiased_estimator_by_hand(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_ks_over_tasks():
    trajs = [traj("a", 1.0), traj("a", 0.0), traj("b", 0.0), traj("b", 0.0)]
    # task a: pass@1 = 1/2, pass@2 = 1; task b: 0 and 0
    assert pass_at_ks(trajs) == {"pass@1": 0.25, "pass@2": 0.5}


def test_breakdown_by_task_fields():
    tasks = [Task("a", "q", payload={"type": "bridge"}, source="hotpotqa"),
             Task("b", "q", payload={"type": "comparison"}, source="hotpotqa")]
    trajs = [traj("a", 1.0, em=1.0), traj("a", 0.0, em=0.0), traj("b", 0.5, em=0.0)]
    out = breakdown(trajs, tasks)
    assert list(out) == ["type"]  # one source only: no breakdown by source
    assert out["type"]["bridge"] == {"n": 2, "score": 0.5, "em": 0.5}
    assert out["type"]["comparison"] == {"n": 1, "score": 0.5, "em": 0.0}


def test_bootstrap_ci_brackets_the_mean_and_collapses_without_variance():
    low, high = bootstrap_ci([0.0, 1.0] * 50)
    assert low < 0.5 < high and high - low < 0.3
    assert bootstrap_ci([0.2] * 10) == (pytest.approx(0.2), pytest.approx(0.2))


def test_per_task_has_tool_error_share_and_answered_by_hand():
    from sleuth.agents.eval.compare import per_task
    from sleuth.agents.trajectory import Turn

    def episode(task_id, errors, answered):
        turns = [Turn([1], [0.0], "x", error="bad" if bad else None, tool_call=None if bad else {"name": "read"})
                 for bad in errors]
        return Trajectory(task_id, "env", [], turns=turns, verdict=Verdict(0.0, {"f1": 0.5}),
                          terminated=answered, truncated=not answered)

    out = per_task([episode("a", [True, False, False, False], True), episode("a", [True, True], False),
                    episode("b", [False], True), Trajectory("b", "env", [], error="env died")])
    # task a: error rates 1/4 and 2/2 → mean 0.625; answered 1 and 0 → 0.5; the failed run of b is left out
    assert out["a"]["tool_error_share"] == pytest.approx(0.625) and out["a"]["answered"] == 0.5
    # valid calls 3 and 0 → 1.5; valid share of the tries 3/4 and 0/2 → 0.375
    assert out["a"]["tool_calls"] == 1.5 and out["a"]["valid_call_share"] == pytest.approx(0.375)
    assert out["b"] == {"score": 0.0, "f1": 0.5, "tool_error_share": 0.0, "answered": 1.0, "tool_calls": 1.0,
                        "valid_call_share": 1.0}


def test_samples_resume_compare_and_report(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["eval", "--tasks", "hotpotqa:test", "--policy", "oracle", "--limit", "5", "--samples", "2",
                 "--temperature", "0.7", "--out", str(a)]) == 0
    lines = (a / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 10
    (a / "trajectories.jsonl").write_text("\n".join(lines[:7]) + "\n")  # interrupted after 7 episodes
    assert main(["eval", "--tasks", "hotpotqa:test", "--policy", "oracle", "--limit", "5", "--samples", "2",
                 "--temperature", "0.7", "--out", str(a)]) == 0
    summary = json.loads((a / "summary.json").read_text())
    assert summary["n"] == 10 and summary["pass@1"] == 1.0 and summary["pass@2"] == 1.0
    samples = sorted(json.loads(x)["meta"]["sample"] for x in (a / "trajectories.jsonl").read_text().splitlines())
    assert samples == [0] * 5 + [1] * 5
    assert "## By type" in (a / "report.md").read_text()
    assert main(["eval", "--tasks", "hotpotqa:test", "--policy", "first-k", "--limit", "5", "--out", str(b)]) == 0
    result = compare(a, b)
    em = next(r for r in result["rows"] if r["metric"] == "em")
    assert result["shared_tasks"] == 5 and em["a"] == 1.0 and em["diff"] == pytest.approx(em["b"] - 1.0)
    assert em["ci_high"] < 0  # the oracle is better on every task
    capsys.readouterr()
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "cmp")]) == 0
    assert "| em | 5 | 1.000 |" in capsys.readouterr().out and (tmp_path / "cmp" / "compare.png").exists()
    assert main(["compare", str(a), str(tmp_path / "missing")]) == 2


def test_a_typod_policy_is_refused_at_once_with_a_suggestion(tmp_path, capsys):
    import time

    t = time.perf_counter()
    assert main(["eval", "--tasks", "hotpotqa:test", "--policy", "orcale", "--limit", "2", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown policy 'orcale' (did you mean 'oracle'?)" in err and "nothing is downloaded" in err
    assert time.perf_counter() - t < 20  # no hub retries
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--concurrency", "0", "--concurrency: must be ≥ 1, got 0"),  # used to hang at 100% CPU
    ("--limit", "-2", "--limit: must be ≥ 1, got -2"),  # used to run 498 of 500 tasks
    ("--samples", "0", "--samples: must be ≥ 1, got 0"),
    ("--max-tokens", "0", "--max-tokens: must be ≥ 1, got 0"),
    ("--temperature", "nan", "--temperature: must be ≥ 0, got nan"),
    ("--samples", "two", "--samples: 'two' is not an integer"),
    ("--out", "", "--out: must name a directory"),
])
def test_eval_refuses_bad_numbers_and_outputs_before_running(tmp_path, capsys, flag, value, message):
    argv = ["eval", "--tasks", "hotpotqa:test", "--policy", "oracle", "--out", str(tmp_path / "r"), flag, value]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_eval_out_naming_a_file_is_refused_and_the_file_kept(tmp_path, capsys):
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    with pytest.raises(SystemExit):
        main(["eval", "--tasks", "hotpotqa:test", "--policy", "oracle", "--out", str(f)])
    assert "is a file, not a directory" in capsys.readouterr().err and f.read_text() == "mine"


def test_bad_yaml_in_an_override_is_a_one_line_error(capsys):
    assert main(["train", "--set", "env_args={harness: json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--set env_args: the value '{harness: json' is not valid YAML" in err[0]


@pytest.mark.parametrize("argv", [
    ["search", "--index", "ix", "--queries", "q.jsonl", "--out", "run", "--k", "0"],
    ["serve", "env", "--max-sessions", "0"],
    ["serve", "verifier", "--name", "qa", "--workers", "0"],
    ["score", "--verifier", "qa", "--input", "a", "--out", "b", "--workers", "-1"],
    ["train", "--max-steps", "0"],
    ["sft", "--max-steps", "-3"],
])
def test_other_commands_refuse_bad_numbers_too(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and "must be ≥" in capsys.readouterr().err


def test_answer_read_splits_reading_from_extracting_by_hand():
    from sleuth.agents.eval.episodes import summarise
    from sleuth.agents.trajectory import ReadEvent, Turn

    def episode(task_id, f1, *answers):
        turns = [Turn([1], [0.0], "read", read=ReadEvent(i, answer=a, shown=shown))
                 for i, (a, shown) in enumerate(answers)]
        return Trajectory(task_id, "env", [], turns=turns, verdict=Verdict(f1, {"f1": f1}), terminated=True)

    trajs = [episode("a", 1.0, (False, True), (True, True)),  # read the answer, used it
             episode("b", 0.5, (True, True)),  # read it, half used it
             episode("c", 0.0, (False, True), (True, False)),  # the answer's document came too late to be seen
             episode("d", 1.0, (None, True)),  # a yes/no question: undefined, left out of both numbers
             episode("e", 0.0)]  # read nothing: undefined
    s = summarise(trajs, 1.0, {})
    assert s["answer_read_rate"] == pytest.approx(2 / 3, abs=1e-4)  # a and b of a, b, c
    assert s["score_when_answer_read"] == pytest.approx(0.75)  # (1.0 + 0.5) / 2
    assert "answer_read" not in s  # the per-episode flag is not averaged over every episode as well
    b = [episode("a", 1.0, (False, True)), episode("b", 0.5, (True, True)), episode("d", 1.0, (None, True))]
    from sleuth.agents.eval.compare import per_task

    assert per_task(b)["a"]["answer_read"] == 0.0 and per_task(b)["b"]["answer_read"] == 1.0
    assert "answer_read" not in per_task(b)["d"]


def test_title_answer_says_whether_the_answer_was_the_name_of_a_document_shown():
    from sleuth.agents.eval.compare import per_task
    from sleuth.agents.eval.episodes import summarise
    from sleuth.agents.trajectory import ReadEvent, Turn

    def episode(task_id, prediction, *reads):
        turns = [Turn([1], [0.0], "read", read=ReadEvent(i, title=title, shown=shown))
                 for i, (title, shown) in enumerate(reads)]
        return Trajectory(task_id, "env", [], turns=turns, terminated=True,
                          verdict=Verdict(0.0, {"f1": 0.0, "prediction": prediction}))

    trajs = [episode("a", "the GameFan!", ("GameFan", True)),  # the title, up to case, article and punctuation
             episode("b", "1978", ("GameFan", True), ("Hot Lead and Cold Feet", True)),  # a span, not a title
             episode("c", "Red Herring", ("GameFan", True), ("Red Herring", False)),  # never shown: not a title
             episode("d", "GameFan"),  # read nothing: undefined
             episode("e", "", ("GameFan", True))]  # no answer: undefined
    s = summarise(trajs, 1.0, {})
    assert s["title_answer_rate"] == pytest.approx(1 / 3, abs=1e-4) and "title_answer" not in s
    m = per_task(trajs)
    assert [m[k]["title_answer"] for k in "abc"] == [1.0, 0.0, 0.0]
    assert "title_answer" not in m["d"] and "title_answer" not in m["e"]
