"""SWE task synthesis from PyPI packages (`sleuth tasks build-swe --package NAME==VERSION --n N --out F`),
in the manner of SWE-smith: fetch the sdist with pip, run the package's own test suite in the sandbox
once with per-test line coverage, keep the tests that pass, mutate covered lines of functions
(`synth/mutations.py`), and keep a mutant only if some tests now fail (FAIL_TO_PASS) while the other
tests of the same test files still pass (PASS_TO_PASS). Deterministic for a seed; appends each task as
it is found and resumes from the tasks and the attempt log beside the output.

Why coverage: a test that never executes the mutated line cannot change outcome (mutations are inside
function bodies, so importing the module is unaffected), so each mutant runs only the test files that
hold a test covering it — seconds instead of the whole suite."""

from __future__ import annotations

import json
import random
import sqlite3
import tempfile
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sleuth.sandbox import Sandbox
from sleuth.sandbox.pytest_run import TestRun, run_pytest
from sleuth.sandbox.repos import RepoCache, RepoSpec, canonical, sha256_of
from sleuth.sandbox.workspace import make_workspace, remove_workspace, unified_diff, write_file
from sleuth.synth.mutations import OPERATORS, Mutation, find_mutations, mutant_ok
from sleuth.synth.statements import leaks, problem_statement
from sleuth.verifiers.swe import is_test_path

# Test dependencies beyond pytest and pytest-cov, and pytest options, for packages known to work here.
KNOWN: dict[str, dict[str, Any]] = {
    "toolz": {},
    "boltons": {},
    "python-dateutil": {"test_deps": ["freezegun", "hypothesis", "attrs"]},
    "more-itertools": {},
}
MAX_PER_FUNCTION = 2  # tasks kept per function, so a set spreads over the code base


@dataclass
class Candidate:
    mutation: Mutation
    covering: list[str]  # baseline-passing tests that execute the mutated statement
    files: list[str]  # their test files: what the mutant is run against


def parse_package(text: str) -> tuple[str, str]:
    name, sep, version = text.partition("==")
    if not sep or not name.strip() or not version.strip():
        raise ValueError(f"give the package as NAME==VERSION (e.g. toolz==1.2.0), not {text!r}")
    return name.strip(), version.strip()


def repo_spec(cache: RepoCache, package: str, test_deps: tuple[str, ...] = ()) -> RepoSpec:
    """`test_deps` adds requirements to those `KNOWN` lists for the package (pytest and pytest-cov always)."""
    name, version = parse_package(package)
    known = KNOWN.get(canonical(name), {})
    deps = dict.fromkeys(("pytest", "pytest-cov", *known.get("test_deps", []), *test_deps))
    spec = RepoSpec(name, version, test_deps=tuple(deps), pytest_args=tuple(known.get("pytest_args", [])))
    archive = cache.sdist(spec)
    spec = replace(spec, sha256=sha256_of(archive), filename=archive.name)
    clean = cache.source(spec)
    return replace(spec, src_root="src" if _packages(clean / "src") else ".")


def _packages(root: Path) -> list[str]:
    """Importable top-level packages under a source root (not tests, docs or build helpers)."""
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").is_file()
                  and not is_test_path(p.name + "/x") and p.name not in ("docs", "doc", "ci_tools", "benchmarks"))


class SWEBuilder:
    def __init__(self, package: str, out: str | Path, n: int = 30, seed: int = 0, workers: int = 2,
                 max_tries: int | None = None, cache: RepoCache | None = None, sandbox: Sandbox | None = None,
                 progress: bool = True, test_deps: tuple[str, ...] = ()):
        self.cache = cache or RepoCache()
        self.sandbox = sandbox or Sandbox()
        self.spec = repo_spec(self.cache, package, tuple(test_deps))
        self.out = Path(out)
        self.n, self.seed, self.workers = n, seed, max(1, workers)
        self.max_tries = max_tries or 8 * n
        self.progress = progress
        self.clean = self.cache.source(self.spec)
        self.env = self.cache.env(self.spec)

    # -- baseline ---------------------------------------------------------------------------------
    def baseline(self) -> dict[str, Any]:
        """Passing tests, their durations and per-line coverage; cached beside the output."""
        path = self.out.with_name(self.out.name + ".baseline.json")
        if path.is_file():
            data = json.loads(path.read_text())
            if data.get("sha256") == self.spec.sha256:
                return data
        pkgs = _packages(self.clean / self.spec.src_root)
        if not pkgs:
            raise ValueError(f"no importable package found in {self.spec.key} under {self.spec.src_root!r}")
        run = run_pytest(self.sandbox, self.clean, self.env, self.spec.src_root, (), self.spec.pytest_args,
                         wall_s=1800, cover=pkgs)
        passing = sorted(t for t, o in run.outcomes.items() if o == "passed")
        if len(passing) < 5:
            raise RuntimeError(f"the test suite of {self.spec.key} does not run here ({run.status}, "
                               f"{len(passing)} passing tests): {run.output[-1500:]}")
        data = {"sha256": self.spec.sha256, "packages": pkgs, "passing": passing, "wall_s": run.wall_s,
                "durations": {t: run.durations.get(t, 0.0) for t in passing},
                "coverage": _coverage_by_line(run, set(passing))}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))
        return data

    # -- candidates -------------------------------------------------------------------------------
    def candidates(self, base: dict[str, Any]) -> list[Candidate]:
        """Covered mutations, shuffled with the seed and interleaved across operators."""
        by_op: dict[str, list[Candidate]] = defaultdict(list)
        for rel, lines in sorted(base["coverage"].items()):
            source = (self.clean / rel).read_text(encoding="utf-8")
            for m in find_mutations(rel, source):
                tests = sorted({t for ln in range(m.line, m.end_line + 1) for t in lines.get(str(ln), [])})
                if tests:
                    files = list(dict.fromkeys(t.split("::", 1)[0] for t in tests))
                    by_op[m.op].append(Candidate(m, tests, files))
        rng = random.Random(self.seed)
        for op in OPERATORS:
            rng.shuffle(by_op[op])
        order, i = [], 0
        while any(by_op.values()):
            op = OPERATORS[i % len(OPERATORS)]
            if by_op[op]:
                order.append(by_op[op].pop(0))
            i += 1
        return order

    # -- one mutant ---------------------------------------------------------------------------------
    def evaluate(self, cand: Candidate, base: dict[str, Any]) -> dict[str, Any]:
        m = cand.mutation
        original = (self.clean / m.path).read_text(encoding="utf-8")
        mutant = m.apply(original)
        if not mutant_ok(original, mutant):
            return {"status": "rejected", "reason": "no semantic change or a syntax error"}
        in_files = [t for t in base["passing"] if t.split("::", 1)[0] in cand.files]
        budget = sum(base["durations"].get(t, 0.05) for t in in_files)
        ws = make_workspace(self.clean)
        try:
            write_file(ws / m.path, mutant)
            run = run_pytest(self.sandbox, ws, self.env, self.spec.src_root, cand.files, self.spec.pytest_args,
                             wall_s=max(60.0, 3 * budget + 20))
        finally:
            remove_workspace(ws)
        if run.status not in ("ok", "error"):
            return {"status": "rejected", "reason": f"test run {run.status}"}
        if run.collect_errors:
            return {"status": "rejected", "reason": "collection errors"}
        f2p = [t for t in in_files if not run.passed(t)]
        p2p = [t for t in in_files if run.passed(t)]
        if not f2p:
            return {"status": "rejected", "reason": "no test fails"}
        if not p2p:
            return {"status": "rejected", "reason": "every test of the files fails"}
        statement = problem_statement(self.spec.name, self.spec.version, f2p, run.failures)
        changed = original.splitlines()[m.line - 1: m.end_line] + mutant.splitlines()[m.line - 1: m.end_line]
        if leaks(statement, changed):
            return {"status": "rejected", "reason": "the failure output shows the mutated line"}
        return {"status": "accepted", "record": self.record(m, original, mutant, f2p, p2p, statement)}

    def record(self, m: Mutation, original: str, mutant: str, f2p: list[str], p2p: list[str],
               statement: str) -> dict[str, Any]:
        key = self.spec.key
        return {
            "instance_id": f"{key}__{m.key}",
            "repo": f"pypi/{canonical(self.spec.name)}",
            "version": self.spec.version,
            "base_commit": f"sdist-sha256:{self.spec.sha256}",
            "patch": unified_diff(m.path, mutant, original),
            "test_patch": "",
            "problem_statement": statement,
            "hints_text": "",
            "created_at": "",
            "FAIL_TO_PASS": json.dumps(f2p),
            "PASS_TO_PASS": json.dumps(p2p),
            "environment_setup_commit": "",
            "bug_patch": unified_diff(m.path, original, mutant),
            "sdist": self.spec.to_dict(),
            "mutation": {"op": m.op, "file": m.path, "function": m.function, "line": m.line},
            "build": {"seed": self.seed, "generator": "sleuth.synth.swe"},
        }

    # -- the whole build ---------------------------------------------------------------------------
    def build(self, on_task: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        from tqdm import tqdm

        base = self.baseline()
        cands = self.candidates(base)
        attempts_path = self.out.with_name(self.out.name + ".attempts.jsonl")
        kept = _read_jsonl(self.out)
        _rewrite_jsonl(self.out, kept)  # drop a line cut by an interrupted build before appending
        kept_keys = {r["instance_id"].rsplit("__", 1)[-1] for r in kept}
        # an attempt logged as accepted whose task line was lost is tried again
        done = {r["mutation_key"]: r for r in _read_jsonl(attempts_path)
                if r.get("status") != "accepted" or r["mutation_key"] in kept_keys}
        _rewrite_jsonl(attempts_path, list(done.values()))
        per_function: dict[str, int] = defaultdict(int)
        for r in kept:
            per_function[f"{r['mutation']['file']}:{r['mutation']['function']}"] += 1
        todo = [c for c in cands if c.mutation.key not in done][: max(0, self.max_tries - len(done))]
        reasons: dict[str, int] = defaultdict(int)
        bar = tqdm(total=self.n, initial=min(len(kept), self.n), desc=f"build-swe {self.spec.key}",
                   disable=not self.progress)
        with ThreadPoolExecutor(self.workers) as pool, open(self.out, "a", encoding="utf-8") as out, \
                open(attempts_path, "a", encoding="utf-8") as log:
            i = 0
            while len(kept) < self.n and i < len(todo):
                batch = []
                while len(batch) < self.workers and i < len(todo):
                    c = todo[i]
                    i += 1
                    fn_key = f"{c.mutation.path}:{c.mutation.function}"
                    if per_function[fn_key] >= MAX_PER_FUNCTION:
                        continue
                    batch.append(c)
                for c, res in zip(batch, pool.map(lambda c: self.evaluate(c, base), batch), strict=True):
                    fn_key = f"{c.mutation.path}:{c.mutation.function}"
                    reason = res.get("reason") or ("enough tasks" if len(kept) >= self.n else
                                                   "function has its tasks" if per_function[fn_key] >= MAX_PER_FUNCTION
                                                   else "")
                    ok = not reason
                    log.write(json.dumps({"mutation_key": c.mutation.key, "status": "accepted" if ok else "rejected",
                                          "reason": reason}) + "\n")
                    log.flush()
                    if ok:
                        kept.append(res["record"])
                        per_function[fn_key] += 1
                        out.write(json.dumps(res["record"]) + "\n")
                        out.flush()
                        bar.update(1)
                        if on_task:
                            on_task(res["record"])
                    else:
                        reasons[reason] += 1
                bar.set_postfix(tried=len(done) + i)
        bar.close()
        return {"package": self.spec.key, "tasks": len(kept), "wanted": self.n, "tried": len(done) + i,
                "candidates": len(cands), "passing_tests": len(base["passing"]), "rejected": dict(reasons),
                "out": str(self.out)}


def _coverage_by_line(run: TestRun, passing: set[str]) -> dict[str, dict[str, list[str]]]:
    """repo-relative file → line → passing tests that executed it, from pytest-cov's per-test contexts."""
    if not run.coverage:
        raise RuntimeError("the baseline run wrote no coverage data (is pytest-cov in the test environment?)")
    from coverage import CoverageData

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "coverage.db"
        db.write_bytes(run.coverage)
        _check_sqlite(db)
        data = CoverageData(basename=str(db))
        data.read()
        out: dict[str, dict[str, list[str]]] = {}
        for measured in data.measured_files():
            rel = _repo_relative(measured)
            if rel is None or is_test_path(rel):
                continue
            lines: dict[str, list[str]] = {}
            for line, contexts in data.contexts_by_lineno(measured).items():
                tests = sorted({c.rsplit("|", 1)[0] for c in contexts if c} & passing)
                if tests:
                    lines[str(line)] = tests
            if lines:
                out[rel] = lines
    return out


def _repo_relative(measured: str) -> str | None:
    if "/work/repo/" in measured:  # the path inside bwrap
        return measured.split("/work/repo/", 1)[1]
    parts = Path(measured).parts  # the rlimits fallback measures host paths: .../repo/<rel>
    return str(Path(*parts[parts.index("repo") + 1:])) if "repo" in parts else None


def _check_sqlite(db: Path) -> None:
    try:
        sqlite3.connect(db).execute("select count(*) from context").fetchone()
    except sqlite3.DatabaseError as e:
        raise RuntimeError(f"the baseline coverage data is unreadable: {e}") from e


def _rewrite_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    tmp.replace(path)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by an interrupted build: that attempt is simply redone
    return out
