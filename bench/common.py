"""What every benchmark does at the end: print its Markdown report and keep it in runs/bench/."""

from pathlib import Path

OUT = Path("runs/bench")


def publish(name: str, title: str, report: str) -> None:
    print(report)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.md").write_text(f"# {title}\n\n{report}\n")


def threaded_load(call, requests: int, clients: int) -> dict[str, float]:
    """`call(i)` for i < `requests` from `clients` threads at once, as the agent loop's env workers call a
    server: requests/s, p50/p99 latency in ms, p99/p50, errors (a call that raised)."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    latencies: list[float] = []
    errors = 0
    lock = threading.Lock()

    def one(i: int) -> None:
        nonlocal errors
        start = time.perf_counter()
        try:
            call(i)
        except Exception:
            with lock:
                errors += 1
        latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(requests)))
    wall = time.perf_counter() - start
    latencies.sort()
    p50, p99 = 1000 * latencies[len(latencies) // 2], 1000 * latencies[int(0.99 * len(latencies))]
    return {"requests": requests, "clients": clients, "rps": requests / wall, "p50_ms": p50, "p99_ms": p99,
            "tail": p99 / p50, "errors": errors}
