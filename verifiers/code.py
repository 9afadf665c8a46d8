"""Unit-test verifier for programs: runs hidden tests in the sandbox. Score = fraction of tests passed;
details name each failure's kind (syntax_error, assertion, exception:<Type>, timeout, memory, exit,
killed, output_limit, not_run, tampering). Reads MBPP and HumanEval layouts, as tasks or as raw records.
Needs neither envs nor torch."""

from __future__ import annotations

import json
import secrets
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sleuth.sandbox import Limits, Sandbox
from sleuth.verifiers.base import Verdict

HARNESS = (Path(__file__).with_name("code_harness.py")).read_text(encoding="utf-8")
# what a test that never reported died of, from the sandbox's view of the whole run
_RUN_KINDS = {"timeout": "timeout", "cpu": "timeout", "memory": "memory", "killed": "killed",
              "output_limit": "output_limit"}


@dataclass
class CodeSpec:
    tests: list[str]
    setup: str = ""


def code_spec(task: Any, challenge: bool = False) -> CodeSpec:
    """Tests of a Task (payload) or a raw record, in MBPP or HumanEval layout."""
    rec = task.payload if hasattr(task, "payload") else task
    if "test_list" in rec:
        for key in ("test_list", "challenge_test_list"):  # a string would run as one test per character
            value = rec.get(key)
            if value is not None and not (isinstance(value, list) and all(isinstance(t, str) for t in value)):
                raise ValueError(f"{key} must be a list of test strings, got {type(value).__name__}")
        tests = list(rec["test_list"]) + (list(rec.get("challenge_test_list") or []) if challenge else [])
        return CodeSpec(tests, rec.get("test_setup_code") or "")
    if "test" in rec and "entry_point" in rec:
        return CodeSpec([f"{rec['test']}\n\ncheck({rec['entry_point']})\n"])
    raise ValueError("not a code task: expected MBPP fields (test_list) or HumanEval fields (test, entry_point)")


class CodeVerifier:
    def __init__(self, sandbox: Sandbox | None = None, per_test_s: float = 5.0, challenge: bool = False):
        self.sandbox = sandbox or Sandbox(Limits(output_bytes=64_000))
        self.per_test_s = per_test_s
        self.challenge = challenge

    def __call__(self, task: Any, response: str, **_: Any) -> Verdict:
        return self.verify(code_spec(task, self.challenge), response or "")

    def verify(self, spec: CodeSpec, program: str) -> Verdict:
        n = len(spec.tests)
        if n == 0:
            return Verdict(0.0, {"passed": 0, "total": 0, "all_passed": False, "error": "the task has no tests"})
        nonce = secrets.token_hex(16)
        payload = {"nonce": nonce, "tests": spec.tests, "setup": spec.setup, "per_test_s": self.per_test_s}
        lim = self.sandbox.limits
        limits = replace(lim, wall_s=self.per_test_s * (n + 1) + 2, cpu_s=int(self.per_test_s * (n + 1)) + 1)
        run = self.sandbox.run_python(HARNESS, {"solution.py": program, "spec.json": json.dumps(payload)},
                                      limits=limits)
        reports: dict[int, dict[str, Any]] = {}
        done = False
        for line in run.stdout.splitlines():
            if not line.startswith(nonce + " "):
                continue  # anything else on the channel is not ours: ignore it
            try:
                rec = json.loads(line[len(nonce) + 1:])
            except json.JSONDecodeError:
                continue
            if rec.get("done"):
                done = True
            elif isinstance(rec.get("test"), int) and 0 <= rec["test"] < n:
                reports.setdefault(rec["test"], rec)
        missing_kind = _RUN_KINDS.get(run.status, "not_run")
        tests = []
        for i in range(n):
            rec = reports.get(i) or {"test": i, "status": "fail", "kind": missing_kind,
                                     "message": "no result: the program ended the run before this test finished"}
            tests.append({k: rec.get(k) for k in ("test", "status", "kind", "message")})
        passed = sum(t["status"] == "pass" for t in tests)
        kinds = Counter(t["kind"] for t in tests if t["status"] != "pass")
        details = {
            "passed": passed, "total": n, "all_passed": passed == n, "failure_kinds": dict(kinds),
            "tests": tests, "completed": done, "run_status": run.status, "isolation": run.isolation,
            "wall_s": run.wall_s, "stderr_tail": run.stderr[-600:],
        }
        if run.warnings:
            details["warnings"] = run.warnings
        return Verdict(passed / n, details)
