"""One scoring path: `sleuth score`, the verifier server's `/score`, `registry.score` and the TRL adapter
give the same score for the same record, with the answer or program extracted from the reply."""

import json

import httpx
import pytest

from sleuth.cli.main import main
from sleuth.core.net import in_thread
from sleuth.servers.verifier import create_app
from sleuth.verifiers.adapters import trl_reward
from sleuth.verifiers.extract import extract_answer
from sleuth.verifiers.registry import score


@pytest.mark.parametrize(("reply", "answer"), [
    ("Answer: Denise Levertov", "Denise Levertov"),
    ("I read two documents.\nThe answer is: Denise Levertov.", "Denise Levertov"),
    ("The final answer is Denise Levertov.", "Denise Levertov"),
    ("<answer>Denise Levertov</answer>", "Denise Levertov"),
    ("Denise Levertov", "Denise Levertov"),
    ("The answer depends on the year", "The answer depends on the year"),  # not an answer line: kept whole
])
def test_answer_extraction(reply, answer):
    assert extract_answer(reply) == answer


def _records(data_dir):
    mbpp = json.loads((data_dir / "mbpp" / "mbpp.jsonl").read_text().splitlines()[1])
    return [("qa", {"answer": "Denise Levertov", "response": "Answer: Denise Levertov"}, 1.0),
            ("qa", {"answer": "Paris", "response": "The answer is: Paris."}, 1.0),
            ("code", {**mbpp, "response": f"Here it is:\n```python\n{mbpp['code']}\n```"}, 1.0)]


def test_every_entry_point_scores_a_record_alike(data_dir, tmp_path, capsys):
    for name, record, expected in _records(data_dir):
        direct = score(name, record, record["response"])
        src, out = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.scored.jsonl"
        src.write_text(json.dumps(record) + "\n")
        assert main(["score", "--verifier", name, "--input", str(src), "--out", str(out)]) == 0
        from_cli = json.loads(out.read_text())["score"]
        with in_thread(create_app(name)) as url:
            from_server = httpx.post(f"{url}/score", json={"records": [record]},
                                     timeout=60).json()["results"][0]["score"]
        fields = {k: [v] for k, v in record.items() if k != "response"}
        from_trl = trl_reward(name)(prompts=["p"], completions=[record["response"]], **fields)[0]
        assert direct == from_cli == from_server == from_trl == expected, (
            name, direct, from_cli, from_server, from_trl)
    capsys.readouterr()


def test_score_refuses_to_overwrite_its_input_and_keeps_bad_lines(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    good = json.dumps({"answer": "Paris", "response": "Paris"}).encode()
    src.write_bytes(good + b"\n" + b'{"answer": "Rome", "response": "R\xffome"}\n' + b"{not json\n" + good + b"\n")
    before = src.read_bytes()
    assert main(["score", "--verifier", "qa", "--input", str(src), "--out", str(src)]) == 2
    assert "is the input file" in capsys.readouterr().err and src.read_bytes() == before
    out = tmp_path / "out.jsonl"
    assert main(["score", "--verifier", "qa", "--input", str(src), "--out", str(out)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["score"] for r in rows] == [1.0, None, None, 1.0]  # one bad byte costs its own line only
    assert "not UTF-8" in rows[1]["error"] and "R\ufffdome" in rows[1]["raw"]
    assert rows[2]["raw"] == "{not json"


def test_a_test_list_given_as_a_string_is_refused(data_dir, tmp_path, capsys):
    mbpp = json.loads((data_dir / "mbpp" / "mbpp.jsonl").read_text().splitlines()[1])
    rec = {**mbpp, "test_list": mbpp["test_list"][0], "response": mbpp["code"]}  # used to run per character
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(json.dumps(rec) + "\n")
    assert main(["score", "--verifier", "code", "--input", str(src), "--out", str(out)]) == 0
    row = json.loads(out.read_text())
    assert row["score"] is None and "test_list must be a list of test strings" in row["error"]
