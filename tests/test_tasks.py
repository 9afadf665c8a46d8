import json

import pytest

from sleuth.tasks import Task, dataset_to_tasks, load_tasks, read_tasks, tasks_to_dataset, write_tasks


def test_hotpotqa_loader_reads_real_records(hotpot_tasks):
    t = hotpot_tasks[0]
    assert t.id == "5a7d5c175542991319bc93b1"
    assert t.answer == "Denise Levertov" and t.source == "hotpotqa" and t.split == "test"
    titles = [d["title"] for d in t.payload["docs"]]
    assert len(titles) == 10 and t.payload["supporting"] == ["Harvey Pekar", "Denise Levertov"]
    for task in hotpot_tasks:  # every supporting title is one of the 10 candidates (SOURCES.md)
        assert set(task.payload["supporting"]) <= {d["title"] for d in task.payload["docs"]}
        assert all(d["text"] for d in task.payload["docs"])


def test_full_splits_have_documented_sizes():
    assert len(load_tasks("hotpotqa:train")) == 300
    assert len(load_tasks("hotpotqa:test", limit=7)) == 7


def test_musique_loader_keeps_aliases_and_supporting():
    tasks = load_tasks("musique:dev", limit=5)
    t = tasks[0]
    assert len(t.payload["docs"]) == 20 and len(t.payload["supporting"]) >= 2
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
