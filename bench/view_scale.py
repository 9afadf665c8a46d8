"""`sleuth view` at scale: a synthetic 100,000-episode trajectories.jsonl (one real oracle episode, its ids and
scores varied), then the time to the first episodes page through the real app, a page at offset 99,950 and a
sorted page over the full index, and the peak RSS. Target: the first page in under 2 s.

    .venv/bin/python bench/view_scale.py [--episodes 100000]
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path


def cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def write_run(out: Path, n: int) -> int:
    """A real oracle episode on a hotpot task, repeated `n` times with other ids, scores and turns."""
    import sleuth
    from sleuth.agents.loop.episodes import run_episodes
    from sleuth.agents.policies.load import load_policy
    from sleuth.tasks import load_tasks

    task = load_tasks("hotpotqa:test", limit=1)[0]
    traj = next(iter(run_episodes(lambda: sleuth.make("DocRead-v0"), [task], load_policy("oracle"))))
    base = traj.to_dict()
    with open(out / "trajectories.jsonl", "w", encoding="utf-8") as f:
        for k in range(n):
            d = dict(base, task_id=f"{task.id}-{k}", group=f"{task.id}-{k}")
            d["verdict"] = dict(base["verdict"], score=(k * 7919 % 1000) / 1000)
            d["turns"] = base["turns"][: 1 + k % len(base["turns"])]
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    (out / "run.json").write_text(json.dumps({"policy": {"spec": "oracle"}, "tasks": "hotpotqa:test"}))
    return (out / "trajectories.jsonl").stat().st_size


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=100_000)
    args = p.parse_args()
    from fastapi.testclient import TestClient

    from sleuth.view.runs import open_runs
    from sleuth.view.server import create_app

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        size = write_run(run, args.episodes)
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        runs = open_runs([run])
        with TestClient(create_app(runs)) as c:  # the background indexer runs, as under `sleuth view`
            first = c.get("/api/run/0/episodes?offset=0&limit=50").json()
            t_first = time.perf_counter() - t0
            while not runs[0].complete() or len(runs[0].index) < args.episodes:
                time.sleep(0.05)
            t_index = time.perf_counter() - t0
            t1 = time.perf_counter()
            last = c.get(f"/api/run/0/episodes?offset={args.episodes - 50}&limit=50").json()
            t_last = time.perf_counter() - t1
            t1 = time.perf_counter()
            top = c.get("/api/run/0/episodes?offset=0&limit=50&sort=-score").json()
            t_sorted = time.perf_counter() - t1
            t1 = time.perf_counter()
            c.get(f"/api/run/0/episode/{args.episodes - 1}").json()
            t_episode = time.perf_counter() - t1
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert len(first["rows"]) == 50 and last["total"] == args.episodes and top["rows"][0]["score"] >= 0.99
    print(f"cpu: {cpu()}")
    print(f"episodes: {args.episodes}, trajectories.jsonl: {size / 1e6:.0f} MB")
    print(f"first page (open + index start + 50 rows): {t_first:.3f} s (target < 2 s)")
    print(f"full index built: {t_index:.2f} s")
    print(f"page at offset {args.episodes - 50}: {t_last * 1000:.1f} ms")
    print(f"sorted page (-score): {t_sorted * 1000:.1f} ms")
    print(f"last episode page (token texts): {t_episode * 1000:.1f} ms")
    print(f"peak RSS: {rss / 1024:.0f} MB (before opening the run: {rss0 / 1024:.0f} MB)")


if __name__ == "__main__":
    main()
