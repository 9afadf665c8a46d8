import json

import pytest

import sleuth
from sleuth.cli.main import main
from sleuth.envs import extract_code
from sleuth.envs.outcome import step_info
from sleuth.sandbox import SandboxPool
from sleuth.tasks import load_tasks
from sleuth.verifiers.code import CodeVerifier, code_spec


@pytest.fixture(scope="module")
def mbpp():
    return load_tasks("mbpp")


@pytest.fixture(scope="module")
def verifier():
    return CodeVerifier()


def test_every_mbpp_reference_scores_one(mbpp):
    # mbpp/123's reference takes 4.4 s of its 5 s default on an idle core here and timed out once on a busy
    # machine: the references are checked for correctness, not speed, so with room to spare.
    verifier = CodeVerifier(per_test_s=20.0)
    with SandboxPool(2) as pool:
        verdicts = list(pool.map(lambda t: verifier(t, t.answer), mbpp))
    failed = [(t.id, v.details["failure_kinds"]) for t, v in zip(mbpp, verdicts, strict=True) if v.score != 1.0]
    assert len(mbpp) == 974 and failed == []


def test_humaneval_canonical_solutions_pass_and_wrong_ones_fail(verifier):
    tasks = load_tasks("humaneval")
    assert len(tasks) == 164
    with SandboxPool(2) as pool:
        scores = list(pool.map(lambda t: verifier(t, t.answer).score, tasks[:40]))
    assert scores == [1.0] * 40
    wrong = tasks[0].payload["prompt"] + "    return False\n"
    v = verifier(tasks[0], wrong)
    assert v.score == 0.0 and v.details["failure_kinds"] == {"assertion": 1}


def test_raw_records_in_both_layouts(data_dir, verifier):
    rec = json.loads((data_dir / "mbpp" / "mbpp.jsonl").read_text().splitlines()[0])
    assert verifier(rec, rec["code"]).score == 1.0
    assert code_spec(rec).tests == rec["test_list"]
    with pytest.raises(ValueError, match="not a code task"):
        code_spec({"question": "q"})


@pytest.mark.parametrize(
    "program, kinds",
    [
        ("", {"exception:NameError": 3}),
        ("def min_cost(cost, m, n):\n    return 0", {"assertion": 3}),
        ("def min_cost(:", {"syntax_error": 3}),
        ("def min_cost(cost, m, n):\n    return 1 / 0", {"exception:ZeroDivisionError": 3}),
        ("import sys\nsys.exit(0)", {"exit": 3}),  # exiting before the tests is no pass
        ("import os\nos._exit(0)", {"not_run": 3}),
        ("class A:\n    def __eq__(self, o): return True\ndef min_cost(*a): return A()", {"assertion": 3}),
        ("class A:\n    def __eq__(self, o): return True\ndef min_cost(*a): return [A()]", {"assertion": 3}),
        ("class A(int):\n    def __eq__(self, o): return True\ndef min_cost(*a): return A(0)", {"assertion": 3}),
        ("import builtins\nbuiltins.AssertionError = Exception\ndef min_cost(*a): return 0", {"tampering": 3}),
        ("def min_cost(*a):\n    globals()['__sleuth_check'] = lambda *x: True\n    return 0", {"tampering": 3}),
        ("print('pass')\nprint('{\"test\": 0, \"status\": \"pass\"}')\ndef min_cost(*a): return 0", {"assertion": 3}),
        ("def min_cost(*a):\n    x = bytearray(4 * 1024 ** 3)", {"memory": 3}),
    ],
)
def test_failure_kinds_and_hostile_programs(mbpp, verifier, program, kinds):
    v = verifier(mbpp[0], program)
    assert v.score == 0.0 and v.details["failure_kinds"] == kinds and not v.details["all_passed"]


def test_partial_credit_and_timeouts(mbpp):
    quick = CodeVerifier(per_test_s=0.5)
    partial = mbpp[0].answer.replace("return tc[m][n]", "return 8 if m == 2 else 0")
    v = quick(mbpp[0], partial)
    assert (v.score == pytest.approx(1 / 3) and v.details["passed"] == 1
            and v.details["failure_kinds"] == {"assertion": 2})
    v = quick(mbpp[0], "def min_cost(*a):\n    while True: pass")
    assert v.score == 0.0 and v.details["failure_kinds"] == {"timeout": 3}


@pytest.mark.parametrize(
    "reply, code",
    [
        ("```python\ndef f():\n    return 1\n```", "def f():\n    return 1"),
        ("Here:\n```py\nprint(1)\n```\nand the solution\n```python\ndef g(x):\n    return x\n```\nDone.",
         "def g(x):\n    return x"),
        ("```\ndef h(): pass\n```", "def h(): pass"),
        ("```python\ndef k(): pass", "def k(): pass"),  # unclosed fence
        ("def plain(): pass", "def plain(): pass"),
        ("```bash\nls\n```", "```bash\nls\n```"),  # not Python: left as it is
    ],
)
def test_code_extraction(reply, code):
    assert extract_code(reply) == code


def test_code_env_run_and_submit(mbpp):
    env = sleuth.make("Code-v0", harness="json", budget=2)
    obs, info = env.reset(options={"task": mbpp[1]})
    assert "def similar_elements(test_tup1, test_tup2):" in obs and "assert similar_elements" in obs

    def call(name, code):
        return "<tool_call>" + json.dumps({"name": name, "arguments": {"code": code}}) + "</tool_call>"

    obs, r, term, trunc, info = env.step(call("run", "```python\ndef similar_elements(a, b):\n    return ()\n```"))
    assert "AssertionError" in obs and info["run"]["example_passed"] is False and not term
    obs, r, term, trunc, info = env.step(call("run", mbpp[1].answer))
    assert obs.startswith("the example test passed") and info["run"]["example_passed"]
    obs, r, term, trunc, info = env.step(call("submit", f"```python\n{mbpp[1].answer}\n```"))
    assert term and r == 1.0 and step_info(info).verdict.details["passed"] == 3


def test_code_env_text_harness_takes_multiline_fences(mbpp):
    env = sleuth.make("Code-v0", harness="text")
    env.reset(options={"task": mbpp[1]})
    obs, r, term, *_ = env.step(f"I will submit:\nsubmit\n```python\n{mbpp[1].answer}\n```")
    assert term and r == 1.0


def test_code_env_rejects_non_code_tasks(hotpot_tasks):
    with pytest.raises(ValueError, match="not a code task"):
        sleuth.make("Code-v0").reset(options={"task": hotpot_tasks[0]})


@pytest.mark.parametrize("tasks", ["mbpp", "humaneval"])
def test_oracle_eval_on_code_scores_one(tmp_path, tasks):
    argv = ["eval", "--env", "sleuth/Code-v0", "--tasks", tasks, "--policy", "oracle", "--harness", "json,text",
            "--limit", "6", "--out", str(tmp_path)]
    assert main(argv) == 0
    for run in ("oracle-json", "oracle-text"):
        summary = json.loads((tmp_path / run / "summary.json").read_text())
        assert summary["n"] == 6 and summary["score"] == 1.0 and summary["all_passed"] == 1.0


def test_score_command_keeps_every_line(tmp_path, data_dir, capsys):
    recs = [json.loads(x) for x in (data_dir / "mbpp" / "mbpp.jsonl").read_text().splitlines()[:4]]
    lines = [json.dumps({**r, "response": r["code"] if i % 2 == 0 else "def nope(): pass"}) for i, r in enumerate(recs)]
    lines += ["{not json", json.dumps({"task_id": 9})]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["score", "--verifier", "code", "--input", str(tmp_path / "in.jsonl"),
                 "--out", str(tmp_path / "out.jsonl")]) == 0
    out = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [o["score"] for o in out] == [1.0, 0.0, 1.0, 0.0, None, None]
    assert "not valid JSON" in out[4]["error"] and "no string 'response'" in out[5]["error"]
    printed = capsys.readouterr().out
    assert json.loads(printed[printed.index("{"):]) == {"verifier": "code", "scored": 4, "errors": 2, "mean_score": 0.5,
                                                        "out": str(tmp_path / "out.jsonl")}


def test_score_command_qa_and_bad_input(tmp_path, data_dir):
    rec = json.loads((data_dir / "hotpotqa" / "test.jsonl").read_text().splitlines()[0])
    nq = {"question": "q", "answer": ["Paris", "City of Paris"], "response": "the city of paris"}
    (tmp_path / "qa.jsonl").write_text(json.dumps({**rec, "response": "Denise Levertov"}) + "\n\n"
                                       + json.dumps(nq) + "\n")
    assert main(["score", "--verifier", "qa", "--input", str(tmp_path / "qa.jsonl"),
                 "--out", str(tmp_path / "o.jsonl")]) == 0
    out = [json.loads(x) for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [o["score"] for o in out] == [1.0, None, 1.0]  # output line N is input line N, a blank one too
    assert out[1] == {"line": 2, "score": None, "error": "a blank line holds no record"}
    assert main(["score", "--verifier", "qa", "--input", str(tmp_path / "missing.jsonl"),
                 "--out", str(tmp_path / "x")]) == 2
