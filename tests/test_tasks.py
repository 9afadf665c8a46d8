import json

import pytest

from sleuth.tasks import Task, TaskError, dataset_to_tasks, load_tasks, read_tasks, tasks_to_dataset, write_tasks
from sleuth.tasks.qa import Document, NoDocuments, QADocs, qa_docs


def test_hotpotqa_loader_reads_real_records(hotpot_tasks):
    t = hotpot_tasks[0]
    assert t.id == "5a7d5c175542991319bc93b1"
    assert t.answer == "Denise Levertov" and t.source == "hotpotqa" and t.split == "test"
    docs = qa_docs(t)
    assert len(docs.titles) == 10 and docs.supporting == ("Harvey Pekar", "Denise Levertov")
    for task in hotpot_tasks:  # every supporting title is one of the 10 candidates (SOURCES.md)
        docs = qa_docs(task)
        assert set(docs.supporting) <= set(docs.titles) and len(docs.gold()) >= len(docs.supporting)
        assert all(d.text for d in docs.docs)


def test_the_document_set_is_typed_on_read_and_plain_json_in_the_payload(hotpot_tasks, tmp_path):
    task = hotpot_tasks[0]
    docs = qa_docs(task)
    assert isinstance(docs.docs[0], Document) and docs.docs[0].to_dict() == task.payload["docs"][0]
    assert {**task.payload, **docs.to_payload()} == task.payload  # the view writes back the layout it read
    write_tasks([task], tmp_path / "t.jsonl")
    back = next(read_tasks(tmp_path / "t.jsonl"))
    assert back == task and qa_docs(back) == docs  # JSONL holds the plain payload; the view reads it alike
    built = Task("b", "q?", payload=QADocs((Document("A", "a"), Document("B", "b")), ("B",)).to_payload())
    assert qa_docs(built).gold() == [1] and json.loads(json.dumps(built.payload)) == built.payload


def test_a_task_without_documents_says_so():
    bare = Task("m1", "Write a function.", payload={"test_list": ["assert f()"]})
    with pytest.raises(NoDocuments, match=r"task m1 has no payload\['docs'\]"):
        qa_docs(bare)
    assert qa_docs(bare, missing_ok=True) == QADocs()  # what a Search task without documents reads
    gold_only = Task("s1", "q?", payload={"supporting": ["A"]})
    assert qa_docs(gold_only, missing_ok=True).supporting == ("A",)
    with pytest.raises(TaskError, match=r"task x: payload\['docs'\] must be a list of"):
        qa_docs(Task("x", "q?", payload={"docs": [{"title": "no text"}]}))
    with pytest.raises(TaskError, match=r"payload\['supporting'\] must be a list of titles"):
        qa_docs(Task("y", "q?", payload={"docs": [{"title": "A", "text": "a"}], "supporting": "A"}))


def test_full_splits_have_documented_sizes():
    assert len(load_tasks("hotpotqa:train")) == 300
    assert len(load_tasks("hotpotqa:test", limit=7)) == 7


def test_musique_loader_keeps_aliases_and_supporting():
    tasks = load_tasks("musique:dev", limit=5)
    t = tasks[0]
    assert len(qa_docs(t).docs) == 20 and len(qa_docs(t).supporting) >= 2
    assert t.answers[0] == t.answer
    assert any(task.aliases for task in load_tasks("musique:dev"))


def test_name_colon_path_reads_user_file(tmp_path, data_dir):
    lines = (data_dir / "hotpotqa" / "dev.jsonl").read_text().splitlines()[:3]
    f = tmp_path / "mine.jsonl"
    f.write_text("\n".join(lines) + "\n")
    tasks = load_tasks(f"hotpotqa:{f}")
    assert [t.id for t in tasks] == [json.loads(x)["id"] for x in lines]
    assert tasks[0].split == "mine"


def test_bad_specs_fail_clearly(tmp_path):
    with pytest.raises(ValueError, match="unknown task source 'nope'"):
        load_tasks("nope:test")
    with pytest.raises(FileNotFoundError, match="no split 'bogus'"):
        load_tasks("hotpotqa:bogus")
    with pytest.raises(FileNotFoundError, match="task file not found"):
        load_tasks(f"hotpotqa:{tmp_path / 'missing.jsonl'}")


def test_jsonl_and_dataset_round_trip(tmp_path, hotpot_tasks):
    tasks = hotpot_tasks[:3] + [Task(id="x", question="q?", answer="a", aliases=["b"], payload={"n": [1, 2]})]
    write_tasks(tasks, tmp_path / "t.jsonl")
    assert list(read_tasks(tmp_path / "t.jsonl")) == tasks
    assert load_tasks(str(tmp_path / "t.jsonl")) == tasks
    assert dataset_to_tasks(tasks_to_dataset(tasks)) == tasks


def test_task_files_in_parquet_and_saved_dataset_form_load_like_jsonl(tmp_path, data_dir):
    import json

    import datasets

    from sleuth.tasks import load_tasks

    src = data_dir / "hotpotqa" / "test.jsonl"
    records = [json.loads(x) for x in src.read_text().splitlines()[:3]]
    datasets.Dataset.from_list(records).to_parquet(str(tmp_path / "mine.parquet"))
    datasets.DatasetDict({"test": datasets.Dataset.from_list(records)}).save_to_disk(str(tmp_path / "saved"))
    want = [t.to_dict() for t in load_tasks(f"hotpotqa:{src}", limit=3)]
    for spec in (f"hotpotqa:{tmp_path / 'mine.parquet'}", f"hotpotqa:{tmp_path / 'saved'}"):
        got = [t.to_dict() for t in load_tasks(spec)]
        assert [{**g, "split": ""} for g in got] == [{**w, "split": ""} for w in want]


def test_empty_and_broken_task_files_name_the_file_and_line(tmp_path, data_dir):
    import pytest

    from sleuth.tasks import load_tasks
    from sleuth.tasks.records import RecordError

    good = (data_dir / "hotpotqa" / "test.jsonl").read_text().splitlines()[0]
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "broken.jsonl").write_text(good + "\n{oops\n")
    (tmp_path / "list.jsonl").write_text("[1, 2]\n")
    with pytest.raises(RecordError, match=r"empty.jsonl holds no records"):
        load_tasks(f"hotpotqa:{tmp_path / 'empty.jsonl'}")
    with pytest.raises(RecordError, match=r"broken.jsonl line 2: not valid JSON"):
        load_tasks(f"hotpotqa:{tmp_path / 'broken.jsonl'}")
    with pytest.raises(RecordError, match=r"list.jsonl line 1: a record must be a JSON object"):
        load_tasks(str(tmp_path / "list.jsonl"))


def test_cli_eval_on_a_broken_task_file_is_one_line(tmp_path, capsys):
    from sleuth.cli.main import main

    (tmp_path / "broken.jsonl").write_text("{oops\n")
    assert main(["eval", "--tasks", f"hotpotqa:{tmp_path / 'broken.jsonl'}", "--policy", "oracle",
                 "--out", str(tmp_path / "o")]) == 2
    assert "broken.jsonl line 1: not valid JSON" in capsys.readouterr().err


def test_a_range_of_a_split_loads_that_part_and_still_counts_as_its_split():
    """`NAME:SPLIT[a:b]` (as `datasets` split strings) lets SFT and RL take disjoint parts of one split; a
    range of the test split is still refused for training, and a range that selects nothing is an error."""
    from sleuth.tasks import LeakageError, held_out_specs

    whole = load_tasks("hotpotqa:train")
    assert [t.id for t in load_tasks("hotpotqa:train[200:]")] == [t.id for t in whole[200:]]
    assert [t.id for t in load_tasks("hotpotqa:train[:5]", limit=3)] == [t.id for t in whole[:3]]
    assert [t.id for t in load_tasks("hotpotqa:train[-2:]")] == [t.id for t in whole[-2:]]
    with pytest.raises(LeakageError, match="held-out test split"):
        held_out_specs("hotpotqa:test[0:10]")
    with pytest.raises(ValueError, match=r"selects no tasks: hotpotqa:train has 300"):
        load_tasks("hotpotqa:train[300:]")


def test_a_data_sets_own_file_read_as_task_records_is_refused_with_the_spec_to_use(tmp_path, data_dir, capsys):
    """A plain path is a Task JSONL: HotpotQA's own layout there used to lose its documents silently."""
    from sleuth.cli.main import main

    path = data_dir / "hotpotqa" / "test.jsonl"
    assert main(["eval", "--tasks", str(path), "--limit", "2", "--policy", "oracle", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "has fields a Task does not (context" in err and f"hotpotqa:{path}" in err


def test_training_on_a_plain_task_file_holds_out_the_eval_tasks_only(tmp_path, hotpot_tasks):
    from sleuth.tasks import held_out_specs, write_tasks

    write_tasks(hotpot_tasks[:2], tmp_path / "mine.jsonl")
    assert held_out_specs(str(tmp_path / "mine.jsonl"), ["hotpotqa:dev"]) == ["hotpotqa:dev"]
    assert held_out_specs("hotpotqa", []) == ["hotpotqa:test"]
