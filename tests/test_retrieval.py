import json

import httpx
import numpy as np
import pytest

import sleuth
from sleuth.cli.main import main
from sleuth.core.net import in_thread
from sleuth.envs.outcome import step_info
from sleuth.envs.retrieval.base import Hit
from sleuth.envs.retrieval.bm25 import BM25Index
from sleuth.envs.retrieval.client import RetrievalClient, RetrievalError
from sleuth.envs.retrieval.corpus import Doc, load_corpus
from sleuth.envs.retrieval.hybrid import rrf
from sleuth.envs.retrieval.index import load_index
from sleuth.envs.retrieval.metrics import ndcg_at_k, recall_at_k
from sleuth.tasks.qa import qa_docs

DOCS = [
    Doc("a", "Paris", "Paris is the capital of France and its largest city."),
    Doc("b", "Lyon", "Lyon is a city in France on the Rhone."),
    Doc("c", "Berlin", "Berlin is the capital of Germany."),
    Doc("d", "Rhone", "The Rhone is a river that flows through Switzerland and France."),
    Doc("e", "Cats", "Cats are small domesticated carnivorous mammals."),
    Doc("f", "Dogs", "Dogs were domesticated from wolves."),
    Doc("g", "Wolves", "The wolf is a large canine native to Eurasia and North America."),
]
QUERIES = ["capital of France", "river Rhone", "domesticated wolves", "Germany capital city", "mammals"]


def test_bm25_backends_agree_exactly_with_robertson_idf():
    a = BM25Index(DOCS, backend="bm25s", method="robertson", k1=1.2, b=0.75)
    b = BM25Index(DOCS, backend="rank_bm25", k1=1.2, b=0.75)
    for q in QUERIES:  # no query term is in more than half the docs, so rank-bm25's idf floor never applies
        # bm25s (as Lucene) drops the constant (k1 + 1) factor of the term weight: same ranking
        np.testing.assert_allclose(a.scores(q) * (1.2 + 1), b.scores(q), rtol=1e-5, atol=1e-6)
        assert [h.id for h in a.search([q], 3)[0]] == [h.id for h in b.search([q], 3)[0]]


def test_bm25_default_ranks_sensibly_and_skips_non_matches():
    idx = BM25Index(DOCS)
    assert [h.id for h in idx.search(["capital of France"], 3)[0]][0] == "a"
    assert idx.search(["zzz unknown words"], 5) == [[]]
    with pytest.raises(ValueError, match="backend"):
        BM25Index(DOCS, backend="lucene")


def test_index_save_load_round_trip(tmp_path):
    for backend in ("bm25s", "rank_bm25"):
        idx = BM25Index(DOCS, backend=backend)
        idx.save(tmp_path / backend)
        again = load_index(tmp_path / backend)
        assert again.search(QUERIES, 4) == idx.search(QUERIES, 4)
        assert again.get("d") == DOCS[3]
    with pytest.raises(FileNotFoundError, match="not a sleuth index"):
        load_index(tmp_path)


def test_rrf_and_metrics_by_hand():
    fused = rrf([[Hit("x", 9), Hit("y", 8)], [Hit("y", 0.9), Hit("z", 0.5)]], k=3, c=60)
    assert [h.id for h in fused] == ["y", "x", "z"]
    assert fused[0].score == pytest.approx(1 / 62 + 1 / 61)
    # one relevant doc at rank 2: DCG = 1/log2(3), IDCG = 1
    assert ndcg_at_k(["q", "r", "s"], {"r": 1}, 10) == pytest.approx(1 / np.log2(3))
    assert recall_at_k(["q", "r"], {"r": 1, "t": 1}, 100) == 0.5


def test_corpus_loader_fields_and_errors(tmp_path, data_dir):
    docs = load_corpus(data_dir / "scifact" / "scifact_corpus.jsonl.gz", id_field="doc_id", text_field="abstract")
    assert len(docs) == 5183 and docs[0].id == "4983" and docs[0].text
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "text": "x"}\n{"id": "1", "text": "y"}\n')
    with pytest.raises(ValueError, match="duplicate id"):
        load_corpus(bad)
    bad.write_text('{"id": "1", "body": "x"}\n')
    with pytest.raises(ValueError, match="no 'text' field"):
        load_corpus(bad)


def test_index_build_and_trec_search_cli(tmp_path, capsys):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(d.to_dict()) + "\n" for d in DOCS))
    queries = tmp_path / "q.jsonl"
    queries.write_text("".join(json.dumps({"id": f"q{i}", "text": q}) + "\n" for i, q in enumerate(QUERIES)))
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq0\ta\t1\nq1\td\t1\n")
    assert main(["index", "build", "--corpus", str(corpus), "--kind", "bm25", "--out", str(tmp_path / "ix")]) == 0
    assert main(["search", "--index", str(tmp_path / "ix"), "--queries", str(queries), "--k", "3",
                 "--out", str(tmp_path / "run.tsv"), "--qrels", str(tmp_path / "qrels.tsv")]) == 0
    first = (tmp_path / "run.tsv").read_text().splitlines()[0].split()
    assert first[:4] == ["q0", "Q0", "a", "1"] and first[5] == "sleuth"
    assert '"ndcg@10": 1.0' in capsys.readouterr().out
    assert main(["index", "build", "--corpus", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "x")]) == 2


@pytest.fixture(scope="module")
def server():
    from sleuth.servers.retrieval import create_app

    with in_thread(create_app(BM25Index(DOCS), max_batch=8)) as url:
        yield url


def test_server_answers_like_the_index(server):
    with RetrievalClient(server) as client:
        assert client.health()["status"] == "ok"
        assert client.search(QUERIES, 3) == BM25Index(DOCS).search(QUERIES, 3)
        assert client.get("c") == DOCS[2] and client.get("nope") is None


@pytest.mark.parametrize(
    "body, status",
    [
        ({"queries": "not a list"}, 422),
        ({"queries": []}, 422),
        ({"queries": ["x"], "k": 0}, 422),
        ({"queries": ["x"] * 9}, 422),  # over max_batch
        ({"queries": ["x" * 20_000]}, 422),
        ({"k": 3}, 422),
    ],
)
def test_server_rejects_malformed_requests_with_4xx(server, body, status):
    r = httpx.post(f"{server}/search", json=body)
    assert r.status_code == status and r.json()["detail"]
    assert httpx.get(f"{server}/health").status_code == 200  # still alive


def test_server_rejects_broken_json_and_huge_bodies(server):
    r = httpx.post(f"{server}/search", content=b"{oops", headers={"content-type": "application/json"})
    assert r.status_code == 422
    r = httpx.post(f"{server}/search", content=b"x" * (3 * 1024 * 1024), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_client_raises_4xx_at_once_and_gives_up_on_a_dead_server(server):
    with RetrievalClient(server) as client, pytest.raises(ValueError, match="rejected"):
        client.search(["x"] * 9)
    dead = RetrievalClient("http://127.0.0.1:9", timeout=0.5, retries=1, backoff=0.01)
    with pytest.raises(RetrievalError, match="after 2 tries"):
        dead.search(["x"])


def test_search_env_with_server_and_gold_title_queries(server, hotpot_tasks):
    env = sleuth.make("Search-v0", harness="json")
    task = hotpot_tasks[0]
    env.reset(options={"task": task})
    call = lambda n, **a: "<tool_call>" + json.dumps({"name": n, "arguments": a}) + "</tool_call>"  # noqa: E731
    for title in qa_docs(task).supporting:  # a scripted policy that queries the gold titles reaches them
        obs, *_, info = env.step(call("search", query=title))
        assert title in info["search"]["gold_retrieved"] and f"[{title}]" in obs
        obs, *_, info = env.step(call("open", doc_id=title))
        assert info["open"]["gold"] and obs.startswith(f"[{title}] {title}\n")
    obs, reward, term, trunc, info = env.step(call("answer", text=task.answer))
    assert term and reward == 1.0 and step_info(info).verdict.details["support_recall"] == 1.0
    remote = sleuth.make("Search-v0", retriever=server, harness="tags")
    remote.reset(options={"task": task})
    obs, *_, info = remote.step("<think>hmm</think><search> capital of France </search>")
    assert obs.startswith("<information>1. [a] Paris:") and info["search"]["retrieved"][0] == "a"
    obs, *_, info = remote.step("<open>zzz</open>")
    assert "no document with id 'zzz'" in step_info(info).error


def test_search_env_oracle_scores_one_in_every_harness(tmp_path):
    argv = ["eval", "--env", "sleuth/Search-v0", "--tasks", "hotpotqa:test", "--policy", "oracle",
            "--harness", "json,text,tags", "--limit", "8", "--out", str(tmp_path)]
    assert main(argv) == 0
    for run in ("oracle-json", "oracle-text", "oracle-tags"):
        s = json.loads((tmp_path / run / "summary.json").read_text())
        assert s["em"] == 1.0 and s["support_recall"] == 1.0 and s["tool_error_rate_turns"] == 0.0


def test_dense_and_hybrid_rank_by_meaning_and_persist(tmp_path):
    from sleuth.envs.retrieval.dense import DenseIndex
    from sleuth.envs.retrieval.hybrid import HybridIndex

    dense = DenseIndex(DOCS)
    top = dense.search(["Which city is France's seat of government?", "pet animals that purr"], 2)
    assert top[0][0].id == "a" and top[1][0].id == "e"
    assert all(0 < h.score <= 1.0001 for row in top for h in row)  # cosine similarity of unit vectors
    dense.save(tmp_path / "dense")
    again = load_index(tmp_path / "dense")
    assert [h.id for h in again.search(QUERIES, 3)[0]] == [h.id for h in dense.search(QUERIES, 3)[0]]
    hnsw = DenseIndex(DOCS, encoder=dense.encoder, hnsw=True)
    assert [h.id for h in hnsw.search(QUERIES, 3)[0]] == [h.id for h in dense.search(QUERIES, 3)[0]]
    hybrid = HybridIndex(BM25Index(DOCS), dense)
    hybrid.save(tmp_path / "hybrid")
    assert load_index(tmp_path / "hybrid").search(QUERIES, 3) == hybrid.search(QUERIES, 3)


def test_gpu_placement_moves_flat_indexes_only(monkeypatch, caplog):
    """faiss's GPU cloner hands HNSW back as a CPU copy without a word; sleuth keeps it on the CPU and says so.
    (No GPU here: faiss's GPU entry points are replaced, only the placement decision is under test.)"""
    import faiss

    from sleuth.envs.retrieval import dense

    moved = []
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 1)
    monkeypatch.setattr(faiss, "StandardGpuResources", object, raising=False)
    monkeypatch.setattr(faiss, "index_cpu_to_gpu", lambda res, dev, index: moved.append(index) or "gpu-index",
                        raising=False)
    flat, hnsw = faiss.IndexFlatIP(8), faiss.IndexHNSWFlat(8, 4, faiss.METRIC_INNER_PRODUCT)
    assert dense._to_gpu(flat) == "gpu-index" and moved == [flat]
    with caplog.at_level("INFO"):
        assert dense._to_gpu(hnsw) is hnsw
    assert moved == [flat] and "HNSW searches on the CPU" in caplog.text


def test_server_refuses_a_chunked_huge_body(server):
    def chunks():
        for _ in range(50):
            yield b"x" * (1024 * 1024)

    r = httpx.post(f"{server}/search", content=chunks(), headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 413
    assert httpx.get(f"{server}/health").status_code == 200


def _strict_trec_run(path):
    """trec_eval's reading of a run: six whitespace-separated fields, integer ranks, float scores; each
    query id in one block, each (query, document) once."""
    blocks, seen = [], set()
    for line in path.read_text().splitlines():
        fields = line.split()
        assert len(fields) == 6 and fields[1] == "Q0", line
        qid, _, doc, rank, score, _ = fields
        int(rank), float(score)
        assert (qid, doc) not in seen, line
        seen.add((qid, doc))
        if not blocks or blocks[-1] != qid:
            assert qid not in blocks, f"query {qid} ranked twice"
            blocks.append(qid)
    return blocks, seen


def test_search_writes_a_valid_trec_run_for_title_ids_and_repeated_queries(tmp_path, capsys):
    from urllib.parse import unquote

    corpus = tmp_path / "c.jsonl"
    docs = [{"id": "Tinted Windows (album)", "title": "Tinted Windows", "text": "debut album of a supergroup"},
            {"id": "100%\tpure", "title": "Pure", "text": "a band from Boston"},
            {"id": "plain", "title": "Plain", "text": "the supergroup first played in Boston"}]
    corpus.write_text("".join(json.dumps(d) + "\n" for d in docs))
    queries = tmp_path / "q.jsonl"
    queries.write_text("".join(json.dumps({"id": qid, "text": t}) + "\n" for qid, t in
                               [("q1", "supergroup album"), ("q2", "Boston band"), ("q1", "supergroup album")]))
    assert main(["index", "build", "--corpus", str(corpus), "--kind", "bm25", "--out", str(tmp_path / "ix")]) == 0
    assert main(["search", "--index", str(tmp_path / "ix"), "--queries", str(queries), "--k", "3",
                 "--out", str(tmp_path / "run.trec")]) == 0
    assert "1 repeated query ids skipped" in capsys.readouterr().err
    blocks, pairs = _strict_trec_run(tmp_path / "run.trec")
    assert blocks == ["q1", "q2"]
    assert {unquote(d) for _, d in pairs} <= {d["id"] for d in docs} and ("q1", "Tinted%20Windows%20(album)") in pairs
    import pytrec_eval  # trec_eval's own reading and measures

    run = pytrec_eval.parse_run((tmp_path / "run.trec").read_text().splitlines())
    qrels = {"q1": {"Tinted%20Windows%20(album)": 1}, "q2": {"100%25%09pure": 1}}
    scores = pytrec_eval.RelevanceEvaluator(qrels, {"recall.3"}).evaluate(run)
    assert scores["q1"]["recall_3"] == 1.0 and scores["q2"]["recall_3"] == 1.0
    queries.write_text(json.dumps({"id": "my query", "text": "x"}) + "\n")
    assert main(["search", "--index", str(tmp_path / "ix"), "--queries", str(queries),
                 "--out", str(tmp_path / "r2")]) == 2
    assert "holds whitespace" in capsys.readouterr().err


def test_search_env_warns_once_when_the_index_is_of_another_corpus(hotpot_tasks):
    import warnings


    env = sleuth.make("Search-v0", retriever=BM25Index(DOCS))  # an index of capitals, not of HotpotQA
    with pytest.warns(UserWarning, match="supporting documents .* is in the index"):
        env.reset(options={"task": hotpot_tasks[0]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env.reset(options={"task": hotpot_tasks[1]})  # said once, counted always
    assert env.unwrapped.tasks_without_gold_in_index == 2
    right = sleuth.make("Search-v0",
                        retriever=BM25Index([Doc(t, t, "text") for t in qa_docs(hotpot_tasks[0]).supporting]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        right.reset(options={"task": hotpot_tasks[0]})
    assert right.unwrapped.tasks_without_gold_in_index == 0


def test_search_opens_are_read_events_the_step_rewards_score(hotpot_tasks):
    """Search's `open` is recorded as a read (`Turn.read`), so information gain scores Search episodes: the
    oracle opens both supporting documents, each a new gold read worth 1/|gold| under the `support` gain."""
    from sleuth.agents.loop.episodes import run_episodes
    from sleuth.agents.policies.load import load_policy
    from sleuth.rewards.info_gain import InfoGain

    task = hotpot_tasks[0]
    (traj,) = run_episodes(lambda: sleuth.make("Search-v0", harness="json"), [task], load_policy("oracle"))
    reads = [t.read for t in traj.turns if t.read is not None]
    assert tuple(r.title for r in reads) == qa_docs(task).supporting and all(r.gold for r in reads)
    gains = InfoGain(variant="support").step_rewards([traj], {task.id: task})[0]
    assert sorted(g for g in gains if g) == [0.5, 0.5]
