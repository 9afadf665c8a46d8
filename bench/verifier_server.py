"""Load test of the verifier server: N concurrent clients send a fixed number of requests; reports
requests/s, p50/p99 latency and errors, next to scoring the same records in-process (overhead ratio).

Run: `make bench` (or `.venv/bin/python bench/verifier_server.py`)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
from common import publish

from sleuth.net import subprocess_server
from sleuth.tasks import data_dir
from sleuth.verifiers.registry import verdict

CLIENTS, REQUESTS = 16, 400


def records(name: str) -> list[dict]:
    if name == "qa":
        rows = [json.loads(x) for x in (data_dir() / "hotpotqa" / "test.jsonl").read_text().splitlines()[:100]]
        return [{"answer": r["answer"], "response": r["answer"] if i % 2 else "no idea"} for i, r in enumerate(rows)]
    rows = [json.loads(x) for x in (data_dir() / "mbpp" / "mbpp.jsonl").read_text().splitlines()[:100]]
    return [{**r, "response": r["code"] if i % 2 else "def f(): pass"} for i, r in enumerate(rows)]


async def hammer(url: str, recs: list[dict]) -> dict[str, float]:
    latencies: list[float] = []
    errors = 0
    todo = iter(range(REQUESTS))

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal errors
        for i in todo:
            start = time.perf_counter()
            try:
                r = await client.post("/score", json={"records": [recs[i % len(recs)]]})
                r.raise_for_status()
                if len(r.json()["results"]) != 1:
                    errors += 1
            except httpx.HTTPError:
                errors += 1
            latencies.append(time.perf_counter() - start)

    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        start = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(CLIENTS)))
        wall = time.perf_counter() - start
    latencies.sort()
    return {"rps": REQUESTS / wall, "p50": 1000 * latencies[len(latencies) // 2],
            "p99": 1000 * latencies[int(0.99 * len(latencies))], "errors": errors}


def main() -> None:
    lines = [f"{CLIENTS} concurrent clients, {REQUESTS} requests of one record each, server with 2 workers.", "",
             "| verifier | server req/s | p50 ms | p99 ms | errors | in-process records/s | ratio in-process/server |",
             "|---|---|---|---|---|---|---|"]
    for name in ("qa", "code"):
        recs = records(name)
        start = time.perf_counter()
        n = min(len(recs), 60)
        for r in recs[:n]:
            verdict(name, r, r["response"], extract=False)
        local = n / (time.perf_counter() - start)
        with subprocess_server(["verifier", "--name", name, "--workers", "2"]) as (url, _):
            res = asyncio.run(hammer(url, recs))
        lines.append(f"| {name} | {res['rps']:.0f} | {res['p50']:.1f} | {res['p99']:.1f} | {res['errors']} | "
                     f"{local:.0f} | {local / res['rps']:.2f} |")
    report = "\n".join(lines)
    publish("verifier_server", "Verifier server load test", report)


if __name__ == "__main__":
    main()
