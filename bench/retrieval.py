"""Retrieval quality and speed on SciFact (a real BEIR task), side by side in one run.

Run: `make bench` (or `.venv/bin/python bench/retrieval.py [--skip-dense]`). Reports, on the 300
validation claims with their qrels: nDCG@10 and Recall@100 for BM25 (bm25s and rank-bm25), dense
(MiniLM + faiss) and hybrid (RRF); build time; queries/s one at a time and batched; resident memory of
each index; the bm25s / rank-bm25 speed ratio; a load test of the retrieval server (concurrent clients,
fixed request count, p50/p99 latency, errors); and the framework overhead of a Search env step.
Published reference points: BEIR BM25 (Elasticsearch) SciFact nDCG@10 = 0.665 (Thakur et al., 2021);
all-MiniLM-L6-v2 on MTEB SciFact ≈ 0.645.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

from common import OUT, publish, threaded_load

from sleuth.core.net import subprocess_server
from sleuth.envs.retrieval.bm25 import BM25Index
from sleuth.envs.retrieval.corpus import load_corpus
from sleuth.envs.retrieval.index import load_index
from sleuth.envs.retrieval.metrics import ndcg_at_k, read_qrels, recall_at_k
from sleuth.tasks import data_dir


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def evaluate(index, queries: list[str], qids: list[str], qrels) -> dict[str, float]:
    start = time.perf_counter()
    for q in queries[:100]:
        index.search([q], 100)
    single = 100 / (time.perf_counter() - start)
    start = time.perf_counter()
    results = index.search(queries, 100)
    batched = len(queries) / (time.perf_counter() - start)
    ranked = [[h.id for h in r] for r in results]
    return {
        "ndcg@10": sum(ndcg_at_k(r, qrels[q], 10) for q, r in zip(qids, ranked, strict=True)) / len(qids),
        "recall@100": sum(recall_at_k(r, qrels[q], 100) for q, r in zip(qids, ranked, strict=True)) / len(qids),
        "qps_single": single, "qps_batched": batched,
    }


def cached_index(kind: str, docs, build) -> tuple[object, float]:
    """Dense encoding of 5,183 abstracts takes minutes on 2 CPU cores: build once, reuse from runs/bench."""
    path = OUT / "indexes" / f"scifact-{kind}"
    stamp = path / "build_s.txt"
    if stamp.exists():
        return load_index(path), float(stamp.read_text())
    start = time.perf_counter()
    index = build(docs)
    seconds = time.perf_counter() - start
    index.save(path)
    stamp.write_text(f"{seconds:.1f}")
    return index, seconds


async def load_test(url: str, queries: list[str], clients: int = 16, requests: int = 800) -> dict[str, float]:
    import httpx

    latencies: list[float] = []
    errors = 0
    todo = iter(range(requests))

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal errors
        for i in todo:
            start = time.perf_counter()
            try:
                r = await client.post("/search", json={"queries": [queries[i % len(queries)]], "k": 10})
                r.raise_for_status()
            except httpx.HTTPError:
                errors += 1
            latencies.append(time.perf_counter() - start)

    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        for q in queries[:50]:  # warm-up (connections, lazy imports), not measured
            await client.post("/search", json={"queries": [q], "k": 10})
        start = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(clients)))
    wall = time.perf_counter() - start
    latencies.sort()
    return {"requests": requests, "clients": clients, "errors": errors, "rps": requests / wall,
            "p50_ms": 1000 * latencies[len(latencies) // 2], "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)]}


def server_bench(index_dir: Path, queries: list[str]) -> dict[str, dict[str, float]]:
    """The same server under 32 concurrent callers two ways: sleuth's `RetrievalClient` from 32 threads (how
    the agent loop's env workers call it), and 32 coroutines sharing one httpx AsyncClient on one event loop,
    the load generator this bench used before: the gap between the two rows is that client's own tail."""
    from sleuth.envs.retrieval.client import RetrievalClient

    with subprocess_server(["retrieval", "--index", str(index_dir)]) as (url, _):
        client = RetrievalClient(url)
        for q in queries[:50]:  # warm-up (connections, lazy imports), not measured
            client.search([q], 10)
        threads = threaded_load(lambda i: client.search([queries[i % len(queries)]], 10), 800, 32)
        coroutines = asyncio.run(load_test(url, queries, clients=32))
    coroutines["tail"] = coroutines["p99_ms"] / coroutines["p50_ms"]
    return {"RetrievalClient, 32 threads": threads, "httpx AsyncClient, 32 coroutines": coroutines}


def search_step_overhead(index) -> dict[str, float]:
    """µs per Search env step (parse, tool call, formatting, info) minus the retriever's own search time."""
    from sleuth.envs.search import SearchEnv
    from sleuth.tasks import load_tasks

    task = load_tasks("hotpotqa:test", limit=1)[0]
    env = SearchEnv(retriever=index, budget=10**9)
    env.reset(options={"task": task})
    action = '<tool_call>{"name": "search", "arguments": {"query": "cell biology protein"}}</tool_call>'
    n = 300
    start = time.perf_counter()
    for _ in range(n):
        env.step(action)
    step = (time.perf_counter() - start) / n
    start = time.perf_counter()
    for _ in range(n):
        index.search(["cell biology protein"], 5)
    retriever = (time.perf_counter() - start) / n
    return {"step_us": step * 1e6, "retriever_us": retriever * 1e6, "overhead_us": (step - retriever) * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-dense", action="store_true", help="BM25 only (dense encoding takes minutes on CPU)")
    args = ap.parse_args()
    base = data_dir() / "scifact"
    docs = load_corpus(base / "scifact_corpus.jsonl.gz", id_field="doc_id", text_field="abstract")
    qrels = read_qrels(str(base / "scifact_qrels_validation.tsv"))
    claims = [json.loads(x) for x in (base / "scifact_claims_validation.jsonl").read_text().splitlines()]
    unique = {str(c["id"]): c["claim"] for c in claims}  # the file repeats a claim once per evidence row
    judged = [(q, text) for q, text in unique.items() if q in qrels]
    qids, queries = [q for q, _ in judged], [t for _, t in judged]
    rows = {}
    for backend in ("bm25s", "rank_bm25"):
        before = rss_mb()
        start = time.perf_counter()
        index = BM25Index(docs, backend=backend)
        rows[f"BM25 ({backend})"] = {"build_s": time.perf_counter() - start, "rss_mb": rss_mb() - before,
                                     **evaluate(index, queries, qids, qrels)}
    if not args.skip_dense:
        from sleuth.envs.retrieval.dense import DenseIndex
        from sleuth.envs.retrieval.hybrid import HybridIndex

        before = rss_mb()
        dense, build_s = cached_index("dense", docs, lambda d: DenseIndex(d, progress=True))
        rows["dense (MiniLM, faiss flat)"] = {"build_s": build_s, "rss_mb": rss_mb() - before,
                                              **evaluate(dense, queries, qids, qrels)}
        hybrid = HybridIndex(BM25Index(docs), dense)
        rows["hybrid (RRF)"] = {"build_s": build_s + rows["BM25 (bm25s)"]["build_s"], "rss_mb": None,
                                **evaluate(hybrid, queries, qids, qrels)}
    lines = [f"SciFact: {len(docs)} abstracts, {len(qids)} judged validation claims.", "",
             "| index | nDCG@10 | Recall@100 | build s | queries/s single | queries/s batched | RSS MB |",
             "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        memory = "the two above" if r["rss_mb"] is None else f"{r['rss_mb']:.0f}"
        lines.append(f"| {name} | {r['ndcg@10']:.4f} | {r['recall@100']:.4f} | {r['build_s']:.1f} | "
                     f"{r['qps_single']:.0f} | {r['qps_batched']:.0f} | {memory} |")
    fast, slow = rows["BM25 (bm25s)"], rows["BM25 (rank_bm25)"]
    lines += ["", f"bm25s / rank-bm25 queries/s, same corpus, same tokens, same queries: "
              f"{fast['qps_single'] / slow['qps_single']:.0f}x single, "
              f"{fast['qps_batched'] / slow['qps_batched']:.0f}x batched."]
    bm25_dir = OUT / "indexes" / "scifact-bm25"
    BM25Index(docs).save(bm25_dir)
    lines += ["", "Retrieval server (BM25, uvicorn, one process), 800 requests of one query, 32 at once:", "",
              "| caller | req/s | p50 ms | p99 ms | p99 / p50 | errors |", "|---|---|---|---|---|---|"]
    for name, load in server_bench(bm25_dir, queries).items():
        lines.append(f"| {name} | {load['rps']:.0f} | {load['p50_ms']:.1f} | {load['p99_ms']:.1f} | "
                     f"{load['tail']:.1f} | {load['errors']} |")
    over = search_step_overhead(BM25Index(docs))
    lines += ["", f"Search env step: {over['step_us']:.0f} µs, of which the retriever {over['retriever_us']:.0f} µs: "
              f"framework overhead {over['overhead_us']:.0f} µs (target < 1000)."]
    report = "\n".join(lines)
    publish("retrieval", "Retrieval on SciFact", report)


if __name__ == "__main__":
    main()
