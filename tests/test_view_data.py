"""`sleuth view`'s data side on real runs: the index (paging, sort, filter, search, a half-written last line, a
torn line, non-UTF-8 bytes), episodes with token texts, a training run's rollouts with their credit sidecar,
the compare endpoint, a folder that is not a run, and the static export."""

import json
import shutil
import time

import pytest
from fastapi.testclient import TestClient

from sleuth.cli.main import main
from sleuth.view.runs import RunError, open_runs
from sleuth.view.server import create_app


@pytest.fixture(scope="module")
def eval_runs(tmp_path_factory):
    """Two real eval runs of hotpot tasks: the oracle, and first-k (which reads the wrong documents)."""
    root = tmp_path_factory.mktemp("evals")
    for policy in ("oracle", "first-k"):
        assert main(["eval", "--env", "sleuth/DocRead-v0", "--tasks", "hotpotqa:test", "--limit", "6",
                     "--policy", policy, "--out", str(root / policy)]) == 0
    return root


def client(*paths):
    return TestClient(create_app(open_runs(list(paths)), index_in_background=False))


def test_an_eval_run_lists_pages_sorts_filters_and_searches(eval_runs):
    c = client(eval_runs / "oracle")
    run = c.get("/api/run/0").json()
    assert run["kind"] == "eval" and run["episodes"] == 6 and run["summary"]["n"] == 6
    assert "report.md" in run["reports"] and run["meta"]["policy"]["spec"] == "oracle"
    page = c.get("/api/run/0/episodes?offset=2&limit=3").json()
    assert page["total"] == 6 and [r["i"] for r in page["rows"]] == [2, 3, 4] and page["complete"]
    assert all(r["score"] == 1.0 and r["turns"] >= 2 and r["tokens"] > 0 for r in page["rows"])
    by_task = c.get("/api/run/0/episodes?sort=task").json()["rows"]
    assert [r["task_id"] for r in by_task] == sorted(r["task_id"] for r in by_task)
    first = by_task[0]["task_id"]
    found = c.get(f"/api/run/0/episodes?q={first.upper()}").json()
    assert found["total"] == 1 and found["rows"][0]["task_id"] == first
    assert c.get("/api/run/0/episodes?status=failed").json()["total"] == 0
    assert c.get("/api/run/0/episodes?stop=final").json()["total"] == 6
    assert c.get("/api/run/0/episodes?sort=bogus").status_code == 400
    assert c.get("/api/run/0/file/report.png").headers["content-type"] == "image/png"
    assert c.get("/api/run/0/file/..%2Frun.json").status_code == 404


def test_an_episode_has_token_texts_and_logprobs(eval_runs):
    c = client(eval_runs / "oracle")
    e = c.get("/api/run/0/episode/1").json()
    assert e["verdict"]["score"] == 1.0 and e["quantities"] == ["logprob"]
    assert "".join(t["text"] for t in e["prompt"]) and e["neighbours"] == {"prev": 0, "next": 2}
    action = e["turns"][0]["action"]
    assert action and all(set(t) >= {"id", "text", "logprob", "adv"} for t in action)
    text = "".join(t["text"] for t in action)  # the action's tokens, its end-of-turn token included
    assert text.startswith(e["turns"][0]["action_text"].strip()) and text.endswith("<|im_end|>")
    assert c.get("/api/run/0/episode/99").status_code == 404


def test_bad_lines_html_and_non_utf8(eval_runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(eval_runs / "oracle", run)
    lines = (run / "trajectories.jsonl").read_bytes().splitlines(keepends=True)
    rec = json.loads(lines[0])
    rec["turns"][0]["action_text"] = "<script>alert(1)</script>"
    rec["task_id"] = "html-task"
    bad = json.dumps(rec, ensure_ascii=False).encode().replace(b"alert(1)", b"alert(\xff\xfe)")
    torn = lines[1][: len(lines[1]) // 2] + b"\n"
    half = lines[2][:100]  # the run is still writing this one
    (run / "trajectories.jsonl").write_bytes(b"".join([bad + b"\n", torn, *lines[3:], half]))
    c = client(run)
    page = c.get("/api/run/0/episodes?limit=all").json()
    assert page["total"] == 1 + len(lines) - 3 and page["torn"] == 1
    e = c.get("/api/run/0/episode/0").json()
    assert e["task_id"] == "html-task" and e["turns"][0]["action_text"] == "<script>alert(\ufffd\ufffd)</script>"
    with open(run / "trajectories.jsonl", "ab") as f:  # the half-written line completes: it is indexed now
        f.write(lines[2][100:])
    assert c.get("/api/run/0/episodes").json()["total"] == len(lines) - 1


def test_a_folder_that_is_not_a_run_is_one_clear_error(tmp_path, capsys):
    (tmp_path / "notes").mkdir()
    with pytest.raises(RunError, match="not a run directory"):
        open_runs([tmp_path])
    assert main(["view", str(tmp_path), "--no-open"]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_a_folder_of_runs_opens_as_its_runs_and_compares(eval_runs):
    c = client(eval_runs)
    runs = c.get("/api/runs").json()["runs"]
    assert [r["name"] for r in runs] == [f"{eval_runs.name}/first-k", f"{eval_runs.name}/oracle"]
    cmp = c.get("/api/compare?a=0&b=1").json()
    assert cmp["counts"]["better"] + cmp["counts"]["same"] == 6 and cmp["counts"]["worse"] == 0
    assert len(c.get("/api/compare?a=0&b=1&filter=better").json()["rows"]) == cmp["counts"]["better"]


def test_a_training_run_shows_rollouts_with_their_credit(eval_runs, tmp_path):
    """A training run's layout (rollouts per step and rank, the credit sidecar, metrics) from real episodes."""
    run = tmp_path / "train"
    (run / "rollouts").mkdir(parents=True)
    lines = (eval_runs / "oracle" / "trajectories.jsonl").read_text().splitlines()[:4]
    recs = [json.loads(x) for x in lines]
    for r in recs:
        r["group"] = "g0"
    (run / "rollouts" / "step-000001.rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    credit = [{"task_id": r["task_id"], "group": "g0", "line": k,
               "adv": [float(k)] * sum(len(t["action_ids"]) for t in r["turns"])} for k, r in enumerate(recs)]
    (run / "rollouts" / "credit").mkdir()
    (run / "rollouts" / "credit" / "step-000001.rank0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in credit))
    (run / "metrics.jsonl").write_text('{"step": 1, "reward/mean": NaN, "loss/policy": 0.5}\n'
                                       '{"step": 2, "reward/mean": 0.5, "loss/policy": 0.4}\n')
    (run / "config.yaml").write_text("model: smollm2\nenv: sleuth/DocRead-v0\n")
    c = client(run)
    page = c.get("/api/run/0").json()
    assert page["kind"] == "train" and page["metric_names"] == ["loss/policy", "reward/mean", "step"]
    assert page["metrics"][0]["reward/mean"] is None
    rows = c.get("/api/run/0/episodes").json()["rows"]
    assert [r["step"] for r in rows] == [1] * 4
    e = c.get("/api/run/0/episode/2").json()
    assert e["quantities"] == ["logprob", "adv"] and {t["adv"] for t in e["turns"][0]["action"]} == {2.0}
    g = c.get("/api/run/0/group/g0?step=1").json()
    assert [m["advantage"] for m in g["members"]] == [0.0, 1.0, 2.0, 3.0] and g["diverged_at"] == 0


def test_the_export_is_one_file_with_the_data_and_no_script_breakout(eval_runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(eval_runs / "oracle", run)
    lines = (run / "trajectories.jsonl").read_text().splitlines()
    rec = json.loads(lines[0])
    rec["turns"][0]["action_text"] = "</script><script>alert(1)</script>"
    (run / "trajectories.jsonl").write_text("\n".join([json.dumps(rec), *lines[1:]]) + "\n")
    out = tmp_path / "view.html"
    assert main(["view", str(run), "--html", str(out)]) == 0
    html = out.read_text()
    assert html.count("window.SLEUTH_DATA = ") == 1 and "<script>alert(1)" not in html
    assert '<script src="' not in html and '<link rel="stylesheet"' not in html
    start = html.index("window.SLEUTH_DATA = ") + len("window.SLEUTH_DATA = ")
    data = json.loads(html[start:html.index(";</script>", start)])
    assert data["/api/run/0/episodes?offset=0&limit=all"]["total"] == 6
    assert data["/api/run/0/episode/0"]["turns"][0]["action_text"] == "</script><script>alert(1)</script>"


def test_a_1_gb_file_without_a_newline_is_scanned_in_bounded_memory_and_skipped(eval_runs, tmp_path):
    """A run whose trajectories.jsonl is 1 GB of NUL bytes (sparse: no disk used) and then one real record: the
    index looks for the giant line's end a chunk at a time, holding none of it, skips it as torn, and shows the
    record after it; while the giant line has no newline the run simply has no episodes yet."""
    import resource

    run = tmp_path / "big"
    shutil.copytree(eval_runs / "oracle", run)
    record = (run / "trajectories.jsonl").read_bytes().splitlines()[0]
    with open(run / "trajectories.jsonl", "wb") as f:
        f.truncate(1 << 30)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with TestClient(create_app(open_runs([str(run)]))) as client:
        for _ in range(300):  # the background indexer reads the gigabyte a chunk at a time
            page = client.get("/api/run/0/episodes?limit=all").json()
            if page["complete"]:
                break
            time.sleep(0.1)
        assert page["total"] == 0 and page["complete"]
        with open(run / "trajectories.jsonl", "ab") as f:
            f.write(b"\n" + record + b"\n")
        for _ in range(100):
            page = client.get("/api/run/0/episodes?limit=all").json()
            if page["total"]:
                break
            time.sleep(0.1)
        assert page["total"] == 1 and page["torn"] == 1 and page["rows"][0]["task_id"] == json.loads(record)["task_id"]
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 300 * 1024  # KiB: far below the 1 GB
