"""Load test of the verifier server: N concurrent threads send a fixed number of requests; reports
requests/s, p50/p99 latency and errors, next to scoring the same records in-process (overhead ratio).

Run: `make bench` (or `.venv/bin/python bench/verifier_server.py`)."""

from __future__ import annotations

import json
import time

import httpx
from common import publish, threaded_load

from sleuth.core.net import subprocess_server
from sleuth.tasks import data_dir
from sleuth.verifiers.registry import verdict

CLIENTS, REQUESTS = 32, 400


def records(name: str) -> list[dict]:
    if name == "qa":
        rows = [json.loads(x) for x in (data_dir() / "hotpotqa" / "test.jsonl").read_text().splitlines()[:100]]
        return [{"answer": r["answer"], "response": r["answer"] if i % 2 else "no idea"} for i, r in enumerate(rows)]
    rows = [json.loads(x) for x in (data_dir() / "mbpp" / "mbpp.jsonl").read_text().splitlines()[:100]]
    return [{**r, "response": r["code"] if i % 2 else "def f(): pass"} for i, r in enumerate(rows)]


def hammer(url: str, recs: list[dict]) -> dict[str, float]:
    """CLIENTS threads sharing one pooled httpx client, as the agent loop's env workers call a server."""
    client = httpx.Client(base_url=url, timeout=60,
                          limits=httpx.Limits(max_connections=64, max_keepalive_connections=64))

    def score(i: int) -> None:
        r = client.post("/score", json={"records": [recs[i % len(recs)]]})
        r.raise_for_status()
        if len(r.json()["results"]) != 1:
            raise ValueError("expected one result")

    for i in range(8):  # warm-up (connections, lazy imports), not measured
        score(i)
    return threaded_load(score, REQUESTS, CLIENTS)


def main() -> None:
    lines = [f"{CLIENTS} concurrent clients, {REQUESTS} requests of one record each, server with 2 workers.", "",
             "| verifier | server req/s | p50 ms | p99 ms | p99 / p50 | errors | in-process records/s | "
             "ratio in-process/server |",
             "|---|---|---|---|---|---|---|---|"]
    for name in ("qa", "code"):
        recs = records(name)
        start = time.perf_counter()
        n = min(len(recs), 60)
        for r in recs[:n]:
            verdict(name, r, r["response"], extract=False)
        local = n / (time.perf_counter() - start)
        with subprocess_server(["verifier", "--name", name, "--workers", "2"]) as (url, _):
            res = hammer(url, recs)
        lines.append(f"| {name} | {res['rps']:.0f} | {res['p50_ms']:.1f} | {res['p99_ms']:.1f} | {res['tail']:.1f} | "
                     f"{res['errors']} | "
                     f"{local:.0f} | {local / res['rps']:.2f} |")
    report = "\n".join(lines)
    publish("verifier_server", "Verifier server load test", report)


if __name__ == "__main__":
    main()
