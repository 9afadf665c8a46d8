"""SWE verifier: a unified diff and a task record are enough. The diff is applied to a fresh copy of the
task's buggy repository, the test files are put back as they were (a patch may not edit the tests that
judge it), and FAIL_TO_PASS and PASS_TO_PASS run in the sandbox. Score 1 only if every one passes;
`details.tests` lists each test's outcome. A malformed or non-applying diff is a verdict (score 0 with
`error`), never an exception.

Records built by `sleuth tasks build-swe` carry their package (`sdist`) and run here. Official SWE-bench
instances (no `sdist`) go to the Docker backend in `swe_docker.py`, which needs a Docker daemon, network
and the `swebench` package, and says which of those is missing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from sleuth.sandbox import Sandbox
from sleuth.sandbox.pytest_run import run_pytest
from sleuth.sandbox.repos import RepoCache, RepoError, RepoSpec
from sleuth.sandbox.workspace import PatchError, apply_patch, make_workspace, remove_workspace, touched_files
from sleuth.verifiers.base import CannotScore, Verdict

CONFIG_FILES = ("pyproject.toml", "setup.cfg", "tox.ini", "pytest.ini", "setup.py", "conftest.py")


def swe_test_ids(value: Any) -> list[str]:
    """FAIL_TO_PASS / PASS_TO_PASS as SWE-bench stores them (a JSON string) or as a list."""
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError("FAIL_TO_PASS / PASS_TO_PASS must be a list of test ids (or a JSON string of one)")
    return value


def swe_record(task: Any) -> dict[str, Any]:
    rec = task.payload if hasattr(task, "payload") else task
    if not isinstance(rec, dict) or "FAIL_TO_PASS" not in rec or "instance_id" not in rec:
        raise ValueError("not a SWE task record: expected SWE-bench fields (instance_id, FAIL_TO_PASS, ...)")
    return rec


def is_test_path(rel: str) -> bool:
    parts = Path(rel).parts
    name = parts[-1] if parts else rel
    return (any(p in ("tests", "test", "testing") for p in parts[:-1]) or name.startswith("test_")
            or name.endswith("_test.py") or name in CONFIG_FILES)


class SWEVerifier:
    def __init__(self, cache: RepoCache | None = None, sandbox: Sandbox | None = None, mode: str = "hardlink",
                 wall_s: float = 300.0):
        self.cache = cache or RepoCache()
        self.sandbox = sandbox or Sandbox()
        self.mode = mode
        self.wall_s = wall_s

    def __call__(self, task: Any, response: str, **_: Any) -> Verdict:
        rec = swe_record(task)
        if "sdist" not in rec:
            from sleuth.verifiers.swe_docker import DockerBackend

            return DockerBackend().verify(rec, response or "")
        return self.verify(rec, response or "")

    def verify(self, rec: dict[str, Any], diff: str) -> Verdict:
        f2p, p2p = swe_test_ids(rec["FAIL_TO_PASS"]), swe_test_ids(rec.get("PASS_TO_PASS") or [])
        base = {"instance_id": rec["instance_id"], "fail_to_pass": len(f2p), "pass_to_pass": len(p2p)}
        if not isinstance(diff, str) or not diff.strip():
            return Verdict(0.0, {**base, "error": "empty_patch", "message": "no change was submitted", "tests": []})
        spec = RepoSpec.from_dict(rec["sdist"])
        try:
            clean, env = self.cache.source(spec), self.cache.env(spec)
        except RepoError as e:  # no sdist, no index, a changed archive: the machine, not the response
            raise CannotScore(str(e)) from e
        ws = buggy_workspace(clean, rec, self.mode)
        try:
            try:
                applied_with = apply_patch(ws, diff)
            except PatchError as e:
                return Verdict(0.0, {**base, "error": "patch_failed", "message": str(e), "tests": []})
            restored = _restore_tests(clean, ws, rec["bug_patch"], touched_files(diff))
            run = run_pytest(self.sandbox, ws, env, spec.src_root, [*f2p, *p2p], spec.pytest_args, self.wall_s)
        finally:
            remove_workspace(ws)
        tests = [{"test": t, "kind": kind, "outcome": run.outcomes.get(t, "not_run")}
                 for kind, ids in (("FAIL_TO_PASS", f2p), ("PASS_TO_PASS", p2p)) for t in ids]
        f2p_ok = sum(run.passed(t) for t in f2p)
        p2p_ok = sum(run.passed(t) for t in p2p)
        resolved = f2p_ok == len(f2p) and p2p_ok == len(p2p) and len(f2p) > 0
        details = {**base, "resolved": resolved, "fail_to_pass_passed": f2p_ok, "pass_to_pass_passed": p2p_ok,
                   "applied_with": applied_with, "restored_test_files": restored, "run_status": run.status,
                   "isolation": run.isolation, "wall_s": run.wall_s, "tests": tests}
        if run.collect_errors:
            details["collect_errors"] = [e["nodeid"] for e in run.collect_errors]
        if run.status not in ("ok", "error"):  # pytest exits 1 when a test fails: that is "error", fine
            details["error"] = f"test run ended with status {run.status}"
        return Verdict(1.0 if resolved else 0.0, details)


def buggy_workspace(clean: Path, rec: dict[str, Any], mode: str = "hardlink") -> Path:
    """A fresh workspace of the task's buggy repository: the clean copy plus the record's `bug_patch`."""
    ws = make_workspace(clean, mode=mode)
    try:
        apply_patch(ws, rec["bug_patch"])
    except PatchError as e:  # the record, not a response, is broken
        remove_workspace(ws)
        raise ValueError(f"the task's bug_patch does not apply to {clean.name}: {e}") from e
    return ws


def _restore_tests(clean: Path, ws: Path, bug_patch: str, touched: list[str]) -> list[str]:
    """Put test files and test configuration a patch touched back to the task's state."""
    restored = []
    buggy = set(touched_files(bug_patch))
    for rel in touched:
        if not is_test_path(rel) or rel in buggy:
            continue
        src, dst = clean / rel, ws / rel
        if dst.exists() or dst.is_symlink():
            dst.unlink()
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
        restored.append(rel)
    return restored
