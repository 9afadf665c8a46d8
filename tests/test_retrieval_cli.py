"""`sleuth index build` and `sleuth search` on odd input, through the real command in a subprocess: one line
on stderr, a non-zero exit, no traceback, and nothing good overwritten."""

import json
import subprocess
import sys


def sleuth(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sleuth.cli", *args], capture_output=True, text=True, timeout=120)


def refused(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def corpus(path, docs):
    path.write_text("".join(json.dumps({"id": i, "title": t, "text": t}) + "\n" for i, t in docs))
    return str(path)


def test_an_empty_corpus_says_so(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    assert "holds no documents" in refused(sleuth("index", "build", "--corpus", str(tmp_path / "empty.jsonl"),
                                                  "--out", str(tmp_path / "ix")))
    assert not (tmp_path / "ix").exists()


def test_an_existing_index_is_kept_unless_forced_and_replaced_only_by_a_complete_one(tmp_path):
    ix = str(tmp_path / "ix")
    assert sleuth("index", "build", "--corpus", corpus(tmp_path / "a.jsonl", [("a", "alpha")]),
                  "--out", ix).returncode == 0
    b = corpus(tmp_path / "b.jsonl", [("b", "beta"), ("c", "gamma")])
    assert "already holds an index" in refused(sleuth("index", "build", "--corpus", b, "--out", ix))
    (tmp_path / "bad.jsonl").write_text('{"id": "x", "text": "fine"}\n{"id": \n')
    refused(sleuth("index", "build", "--corpus", str(tmp_path / "bad.jsonl"), "--out", ix, "--force"))
    assert json.loads((tmp_path / "ix" / "meta.json").read_text())["n_docs"] == 1  # the old index is intact
    assert sleuth("index", "build", "--corpus", b, "--out", ix, "--force").returncode == 0
    assert json.loads((tmp_path / "ix" / "meta.json").read_text())["n_docs"] == 2
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary left


def test_qrels_are_checked_before_the_run_and_a_qrels_file_judging_none_of_the_queries_says_so(tmp_path):
    ix = str(tmp_path / "ix")
    assert sleuth("index", "build", "--corpus", corpus(tmp_path / "c.jsonl", [("a", "alpha"), ("b", "beta")]),
                  "--out", ix).returncode == 0
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"id": "q1", "text": "alpha"}\n{"id": "q2", "text": "beta"}\n')
    run = tmp_path / "run.tsv"
    search = ["search", "--index", ix, "--queries", str(queries), "--out", str(run)]
    assert "qrels file not found" in refused(sleuth(*search, "--qrels", str(tmp_path / "nope.tsv")))
    assert not run.exists()  # found before any work, not after the run is written
    (tmp_path / "other.tsv").write_text("query-id\tcorpus-id\tscore\n7\ta\t1\n8\tb\t1\n")
    line = refused(sleuth(*search, "--qrels", str(tmp_path / "other.tsv")))
    assert "none of the 2 query ids is judged" in line and "q1" in line and "7" in line
    assert run.exists()
    (tmp_path / "half.tsv").write_text("q1\t0\ta\t1\n")
    ok = sleuth(*search, "--qrels", str(tmp_path / "half.tsv"))
    assert ok.returncode == 0 and '"judged_queries": 1, "queries": 2' in ok.stdout


def test_a_directory_that_is_not_an_index_is_named(tmp_path):
    (tmp_path / "ix").mkdir()
    (tmp_path / "ix" / "meta.json").write_text("{}")
    (tmp_path / "q.jsonl").write_text('{"id": "q1", "text": "alpha"}\n')
    line = refused(sleuth("search", "--index", str(tmp_path / "ix"), "--queries", str(tmp_path / "q.jsonl"),
                          "--out", str(tmp_path / "run.tsv")))
    assert "names no index kind" in line
