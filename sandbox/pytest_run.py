"""Run a repository's pytest suite in the sandbox: the workspace and the test environment are mounted
read-only (tests may write only to their private /tmp), and the outcome of every test comes back through
`pytest_report.py`, not by parsing pytest's terminal output."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sleuth.sandbox.limits import Limits
from sleuth.sandbox.runner import Sandbox

PLUGIN = Path(__file__).with_name("pytest_report.py").read_text(encoding="utf-8")
REPORT = "pytest-report.jsonl"
COVERAGE = "coverage.db"
PASSING = ("passed", "xfailed")  # outcomes a test suite counts as green


@dataclass
class TestRun:
    """`outcomes`: node id → passed | failed | error | skipped | xfailed | xpassed (a test with no line
    did not run). `failures`: node id → {message, frames} of its first failing phase."""

    __test__ = False  # not a pytest test class

    outcomes: dict[str, str]
    failures: dict[str, dict[str, Any]]
    collect_errors: list[dict[str, str]]
    output: str
    status: str
    wall_s: float
    isolation: str
    coverage: bytes | None = None
    durations: dict[str, float] = field(default_factory=dict)  # seconds per test, all phases
    warnings: list[str] = field(default_factory=list)

    def passed(self, nodeid: str) -> bool:
        return self.outcomes.get(nodeid) in PASSING


def check_selectors(selectors: Sequence[str]) -> list[str]:
    """Test node ids or paths only: nothing that pytest would read as an option."""
    out = []
    for s in selectors:
        if not isinstance(s, str) or not s.strip():
            continue
        s = s.strip()
        if s.startswith("-") or "\x00" in s:
            raise ValueError(f"not a test selector: {s!r} "
                             "(give test paths or node ids such as tests/test_x.py::test_y)")
        out.append(s)
    return out


def suite_limits(wall_s: float) -> Limits:
    """Test suites need more than a snippet: memory for pytest and its plugins, threads, bigger output."""
    return Limits(wall_s=wall_s, cpu_s=int(wall_s) + 5, memory_mb=4096, processes=64, file_mb=256,
                  open_files=1024, output_bytes=200_000)


def run_pytest(sandbox: Sandbox, workspace: Path, env: Path, src_root: str = ".", selectors: Sequence[str] = (),
               pytest_args: Sequence[str] = (), wall_s: float = 120.0, cover: Sequence[str] = (),
               extra_args: Sequence[str] = ()) -> TestRun:
    """Run `selectors` (all tests when empty) of the repository in `workspace` with the venv `env`.
    `cover` lists package folders to measure line coverage of, per test (pytest-cov contexts)."""
    selectors = check_selectors(selectors)
    argv = ["{work}/env/bin/python", "-m", "pytest", "-p", "sleuth_pytest_report", "-p", "no:cacheprovider",
            "-q", "--tb=short", "-rN", "--color=no", *pytest_args, *extra_args]
    if cover:
        argv += [*(f"--cov={c}" for c in cover), "--cov-context=test", "--cov-report="]
    argv += selectors
    src = "{work}/repo" if src_root in ("", ".") else "{work}/repo/" + src_root.strip("/")
    env_vars = {"PYTHONPATH": f"{{work}}/plugins:{src}", "SLEUTH_PYTEST_REPORT": "{work}/" + REPORT,
                "COVERAGE_FILE": "{work}/" + COVERAGE, "TMPDIR": "/tmp" if sandbox.bwrap else "{work}/tmp",
                "PYTHONHASHSEED": "0", "TZ": "UTC"}
    res = sandbox.run(argv, files={"plugins/sleuth_pytest_report.py": PLUGIN, "tmp/.keep": ""},
                      limits=suite_limits(wall_s),
                      mounts={"repo": workspace, "env": env}, collect=(REPORT, COVERAGE), cwd="repo", env=env_vars)
    outcomes, failures, collect_errors, durations = parse_report(res.files.get(REPORT, b""))
    return TestRun(outcomes, failures, collect_errors, res.stdout + res.stderr, res.status, res.wall_s,
                   res.isolation, res.files.get(COVERAGE), durations, list(res.warnings))


def parse_report(data: bytes) -> tuple[dict[str, str], dict[str, dict[str, Any]], list[dict[str, str]],
                                        dict[str, float]]:
    outcomes: dict[str, str] = {}
    durations: dict[str, float] = {}
    failures: dict[str, dict[str, Any]] = {}
    errors: list[dict[str, str]] = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(rec, dict):
            continue
        if "collect_error" in rec:
            errors.append({"nodeid": str(rec["collect_error"]), "message": str(rec.get("message", ""))})
            continue
        nodeid, when, outcome = rec.get("nodeid"), rec.get("when"), rec.get("outcome")
        if not isinstance(nodeid, str):
            continue
        if isinstance(rec.get("duration"), (int, float)):
            durations[nodeid] = durations.get(nodeid, 0.0) + float(rec["duration"])
        now = _phase_outcome(when, outcome, bool(rec.get("xfail")))
        if now is None:
            continue
        if outcome == "failed" and nodeid not in failures:
            failures[nodeid] = {"when": when, "message": rec.get("message", ""), "frames": rec.get("frames", [])}
        prev = outcomes.get(nodeid)
        if prev in ("failed", "error"):
            continue  # the first failure decides: a later teardown cannot make a failed test pass
        if prev is None or now in ("failed", "error") or when == "call":
            outcomes[nodeid] = now
    return outcomes, failures, errors, durations


def _phase_outcome(when: str, outcome: str, xfail: bool) -> str | None:
    if outcome == "failed":
        return "failed" if when == "call" else "error"
    if outcome == "skipped":
        return "xfailed" if xfail else "skipped"
    if outcome == "passed":
        if when == "call":
            return "xpassed" if xfail else "passed"
        return None  # a passing setup or teardown says nothing on its own
    return None
