"""Sandbox throughput, measured side by side with the alternative a user would pick: a bare
`subprocess.run` of the same interpreter in a temp dir (no isolation, no limits).

Run: `make bench` (or `.venv/bin/python bench/sandbox.py`). Prints executions/s and ratios for a trivial
program and a realistic one (an MBPP reference solution with its tests), sequentially and with a pool of
2 workers; then the cost of the code verifier over all 974 MBPP reference solutions.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import publish

from sleuth.sandbox import Limits, Sandbox, SandboxPool
from sleuth.tasks import load_tasks
from sleuth.verifiers.code import CodeVerifier

N = 60  # executions per measurement
ROUNDS = 3


def bare_runner(python: str):
    def run(code: str) -> None:
        with tempfile.TemporaryDirectory() as d:
            Path(d, "main.py").write_text(code)
            subprocess.run([python, "-I", "-S", "main.py"], cwd=d, capture_output=True, timeout=30)

    return run


def rate(run, programs: list[str], workers: int) -> float:
    """Median executions/s over ROUNDS rounds."""
    rates = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        if workers == 1:
            for p in programs:
                run(p)
        else:
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(run, programs))
        rates.append(len(programs) / (time.perf_counter() - start))
    return statistics.median(rates)


def main() -> None:
    sandbox = Sandbox(Limits(wall_s=30))
    rlimits = Sandbox(Limits(wall_s=30), isolation="rlimits")
    bare = bare_runner(sandbox.python)
    mbpp = load_tasks("mbpp")
    realistic = [f"{t.answer}\n\n{t.payload['test_setup_code']}\n" + "\n".join(t.payload["test_list"])
                 for t in mbpp[:N]]
    workloads = {"trivial (print)": ["print(1)"] * N, "realistic (MBPP solution + tests)": realistic}
    lines = [f"Sandbox: isolation={sandbox.isolation}, a fresh uid per run: {bool(sandbox.setpriv)}, "
             f"interpreter {sandbox.python} -I -S", "",
             "| workload | workers | bare subprocess /s | sandbox (bwrap) /s | ratio bare/sandbox | rlimits-only /s |",
             "|---|---|---|---|---|---|"]
    for name, programs in workloads.items():
        for workers in (1, 2):
            b = rate(bare, programs, workers)
            s = rate(lambda p: sandbox.run_python(p), programs, workers)
            r = rate(lambda p: rlimits.run_python(p), programs, workers)
            lines.append(f"| {name} | {workers} | {b:.1f} | {s:.1f} | {b / s:.2f} | {r:.1f} |")
    verifier = CodeVerifier()
    start = time.perf_counter()
    with SandboxPool(2) as pool:
        verdicts = list(pool.map(lambda t: verifier(t, t.answer), mbpp))
    wall = time.perf_counter() - start
    passed = sum(v.score == 1.0 for v in verdicts)
    lines += ["", f"Code verifier over all {len(mbpp)} MBPP reference solutions (pool of 2): {wall:.1f} s, "
              f"{len(mbpp) / wall:.1f} records/s, {passed}/{len(mbpp)} scored 1.0."]
    report = "\n".join(lines)
    publish("sandbox", "Sandbox throughput", report)


if __name__ == "__main__":
    sys.exit(main())
