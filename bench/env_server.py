"""Load test of remote envs: episodes spread over two local env servers, side by side with the same
episodes in process. Reports episodes/s, p50/p99 step latency, lost episodes, and the overhead ratio.

Run: `make bench` (or `.venv/bin/python bench/env_server.py`)."""

from __future__ import annotations

import contextlib
import time

import gymnasium
from common import publish

import sleuth
from sleuth.agents.loop.episodes import run_episodes
from sleuth.agents.policies.load import load_policy
from sleuth.core.net import subprocess_server
from sleuth.envs.remote import RemoteEnv
from sleuth.tasks import load_tasks

EPISODES, CONCURRENCY = 200, 32


@contextlib.contextmanager
def servers(n: int):
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(subprocess_server(["env", "--env", "sleuth/DocRead-v0", "--max-sessions", "128"]))[0]
               for _ in range(n)]


class Timed(gymnasium.Wrapper):
    latencies: list[float] = []

    def step(self, action):
        start = time.perf_counter()
        out = self.env.step(action)
        Timed.latencies.append(time.perf_counter() - start)
        return out


def run(make_env, tasks, policy, env_threads: int = 0) -> dict[str, float]:
    Timed.latencies = []
    start = time.perf_counter()
    trajs = list(run_episodes(lambda: Timed(make_env()), tasks, policy, concurrency=CONCURRENCY,
                              env_threads=env_threads))
    wall = time.perf_counter() - start
    lat = sorted(Timed.latencies)
    return {"eps": len(trajs) / wall, "p50": 1e3 * lat[len(lat) // 2], "p99": 1e3 * lat[int(0.99 * len(lat))],
            "lost": len(tasks) - len(trajs), "failed": sum(t.reward != 1.0 for t in trajs)}


def main() -> None:
    tasks = load_tasks("hotpotqa:test", limit=EPISODES)
    policy = load_policy("oracle")
    run(lambda: sleuth.make("DocRead-v0"), tasks[:40], policy)  # warm-up: imports, caches
    local = run(lambda: sleuth.make("DocRead-v0"), tasks, policy)
    with servers(2) as urls:
        remote = run(lambda: RemoteEnv(",".join(urls)), tasks, policy)
        threaded = run(lambda: RemoteEnv(",".join(urls)), tasks, policy, env_threads=CONCURRENCY)
    lines = [f"{EPISODES} DocRead episodes (scripted oracle), {CONCURRENCY} at once.", "",
             "| where | episodes/s | step p50 ms | step p99 ms | p99 / p50 | lost | not solved |",
             "|---|---|---|---|---|---|---|",
             f"| in process | {local['eps']:.0f} | {local['p50']:.3f} | {local['p99']:.3f} | "
             f"{local['p99'] / local['p50']:.1f} | {local['lost']} | {local['failed']} |",
             f"| two env servers over HTTP | {remote['eps']:.0f} | {remote['p50']:.2f} | {remote['p99']:.2f} | "
             f"{remote['p99'] / remote['p50']:.1f} | "
             f"{remote['lost']} | {remote['failed']} |",
             f"| two env servers, steps in {CONCURRENCY} threads (`env_threads`) | {threaded['eps']:.0f} | "
             f"{threaded['p50']:.2f} | {threaded['p99']:.2f} | {threaded['p99'] / threaded['p50']:.1f} | "
             f"{threaded['lost']} | {threaded['failed']} |", "",
             f"Overhead: in-process episodes/s ÷ remote = {local['eps'] / remote['eps']:.1f}x steps in turn, "
             f"{local['eps'] / threaded['eps']:.1f}x steps in threads (the policy here is scripted and instant, so "
             "this is the HTTP cost alone; with a real model it hides behind generation)."]
    report = "\n".join(lines)
    publish("env_server", "Remote env load test", report)


if __name__ == "__main__":
    main()
