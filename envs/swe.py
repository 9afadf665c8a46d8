"""SWE (`sleuth/SWE-v0`): fix a real repository. Each episode gets a fresh workspace holding the task's
buggy repository; tools list, read, search and edit its files and run its tests in the sandbox; `submit`
ends the episode and the SWE verifier scores the diff of the workspace against the buggy repository, on
a clean copy (so the reward is exactly what `sleuth score --verifier swe` gives that diff).

Paths are relative to the repository root and cannot leave it. Edits replace files by rename, so the
clean copy the workspace hard-links to is never touched; test runs see the workspace read-only."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

from sleuth.envs.base import ToolEnv
from sleuth.envs.outcome import ResetInfo
from sleuth.envs.parsers import ToolCall
from sleuth.envs.tools import ToolError, tool
from sleuth.sandbox import Sandbox
from sleuth.sandbox.pytest_run import check_selectors, run_pytest
from sleuth.sandbox.repos import RepoCache, RepoSpec
from sleuth.sandbox.workspace import (
    remove_workspace,
    resolve,
    unified_diff,
    write_file,
)
from sleuth.tasks.base import Task
from sleuth.verifiers.base import Verdict
from sleuth.verifiers.swe import SWEVerifier, buggy_workspace, swe_record, swe_test_ids

MAX_READ_LINES = 200
MAX_MATCHES = 50
MAX_TEST_OUTPUT = 3000


class SWEEnv(ToolEnv):
    instructions = (
        "You are fixing a bug in a Python repository. The problem statement names the failing tests. Explore "
        "the code with list_dir, read_file and search, change it with edit, check your fix with run_tests, "
        "and call submit when the failing tests pass. Do not edit the tests."
    )
    budget_unit = "turns"
    default_budget = 20

    def __init__(self, *, cache: RepoCache | None = None, sandbox: Sandbox | None = None,
                 workspace_mode: str = "hardlink", test_timeout_s: float = 120.0, **kwargs: Any):
        self.cache = cache or RepoCache()
        self.sandbox = sandbox or Sandbox()
        self.workspace_mode = workspace_mode
        self.test_timeout_s = test_timeout_s
        self.ws = None
        super().__init__(**kwargs)

    def default_verifier(self) -> SWEVerifier:
        return SWEVerifier(self.cache, self.sandbox)

    @classmethod
    def oracle(cls, task: Task, turn: int, start: ResetInfo) -> ToolCall:
        """Replay the gold patch through the tools (`swe_gold_plan`); past its end, submit again."""
        plan = swe_gold_plan(task.answer)
        return plan[min(turn, len(plan) - 1)]

    # -- episode ---------------------------------------------------------------------------------
    def on_reset(self, task: Task) -> None:
        rec = swe_record(task)
        if "sdist" not in rec:
            raise ValueError(f"{task.id} is an official SWE-bench instance: its repository exists only in "
                             "SWE-bench's Docker image, so it cannot be an episode here; score patches for it "
                             "with the swe verifier's Docker backend")
        self._drop_workspace()
        # `repo`, not `spec`: gymnasium's Env.spec is the env's registration (EnvSpec), which its checker reads
        self.repo = RepoSpec.from_dict(rec["sdist"])
        self.venv = self.cache.env(self.repo)
        self.ws = buggy_workspace(self.cache.source(self.repo), rec, self.workspace_mode)
        self.fail_to_pass = swe_test_ids(rec["FAIL_TO_PASS"])
        self.originals: dict[str, str] = {}  # text of each edited file before its first edit
        self._last_tests: dict[str, Any] | None = None

    def user_message(self, task: Task) -> str:
        return f"{task.question}\n\nThe repository is your working directory ('.')."

    def score(self, response: str) -> Verdict:
        """A truncated episode (budget spent) is scored on its workspace as it stands, as SWE-agent's
        auto-submit does: the edits made count even without a final `submit`."""
        try:
            return super().score(response or self.submit())
        finally:
            self._drop_workspace()

    def close(self) -> None:
        self._drop_workspace()
        super().close()

    def _drop_workspace(self) -> None:
        if self.ws is not None:
            remove_workspace(self.ws)
            self.ws = None

    def step_info(self) -> dict[str, Any]:
        tests, self._last_tests = self._last_tests, None
        return {"tests": tests} if tests else {}

    # -- tools -------------------------------------------------------------------------------------
    def _path(self, path: str):
        if self.ws is None:
            raise ToolError("the episode is over: no workspace")
        try:
            return resolve(self.ws, path)
        except PermissionError as e:
            raise ToolError(str(e)) from None

    def _rel(self, p) -> str:
        return str(p.relative_to(self.ws.resolve()))

    @tool
    def list_dir(self, path: str = ".") -> str:
        """List a folder of the repository (folders end with /).

        Args:
            path: folder relative to the repository root
        """
        p = self._path(path)
        if not p.is_dir():
            raise ToolError(f"{path!r} is not a folder")
        names = sorted(x.name + ("/" if x.is_dir() else "") for x in p.iterdir()
                       if x.name != "__pycache__" and not x.name.endswith(".sleuth-tmp"))
        return "\n".join(names) or "(empty)"

    @tool
    def read_file(self, path: str, start: int = 1, end: int | None = None) -> str:
        """Show lines start..end (1-based, inclusive) of a file, with line numbers; at most 200 lines.

        Args:
            path: file relative to the repository root
            start: first line to show
            end: last line to show (default: start + 199)
        """
        p = self._path(path)
        if not p.is_file():
            raise ToolError(f"no file {path!r}" + ("; it is a folder: use list_dir" if p.is_dir() else ""))
        lines = p.read_text(encoding="utf-8", errors="replace").splitlines()
        start = max(1, start)
        end = min(len(lines), end if end is not None else start + MAX_READ_LINES - 1, start + MAX_READ_LINES - 1)
        if start > len(lines):
            raise ToolError(f"{path} has {len(lines)} lines; start={start} is past the end")
        body = "\n".join(f"{i:>5}  {lines[i - 1]}" for i in range(start, end + 1))
        more = f"\n({len(lines) - end} more lines)" if end < len(lines) else ""
        return f"{self._rel(p)} lines {start}-{end} of {len(lines)}:\n{body}{more}"

    @tool
    def search(self, pattern: str, path: str = ".") -> str:
        """Search the repository's text files for a regular expression (grep -E); at most 50 matches.

        Args:
            pattern: extended regular expression
            path: folder or file to search in
        """
        if not pattern:
            raise ToolError("search needs a non-empty pattern")
        p = self._path(path)
        grep = shutil.which("grep")
        if grep is None:
            raise ToolError("search is unavailable: grep is not installed")
        # grep, not Python's re: its matcher has no catastrophic backtracking, and a timeout bounds the rest
        cmd = [grep, "-rnIE", "--exclude-dir=__pycache__", "-e", pattern, "--",
               self._rel(p) if p != self.ws.resolve() else "."]
        try:
            r = subprocess.run(cmd, cwd=self.ws, capture_output=True, text=True, timeout=10)
        except subprocess.TimeoutExpired:
            raise ToolError("search took over 10 s: use a simpler pattern or a narrower path") from None
        if r.returncode == 2:
            raise ToolError(f"bad pattern: {r.stderr.strip()[:300]}")
        hits = [h.removeprefix("./") for h in r.stdout.splitlines()]
        if not hits:
            return f"no matches for {pattern!r}"
        shown = [h if len(h) <= 200 else h[:200] + "…" for h in hits[:MAX_MATCHES]]
        more = f"\n({len(hits) - MAX_MATCHES} more matches)" if len(hits) > MAX_MATCHES else ""
        return "\n".join(shown) + more

    @tool
    def edit(self, path: str, old: str, new: str) -> str:
        """Replace the one exact occurrence of `old` in a file with `new`.

        Args:
            path: file relative to the repository root
            old: the exact text to replace (include enough lines to make it unique)
            new: the replacement text
        """
        p = self._path(path)
        if not p.is_file():
            raise ToolError(f"no file {path!r}")
        if not old:
            raise ToolError("old must not be empty: give the exact text to replace")
        text = p.read_text(encoding="utf-8")
        count = text.count(old)
        if count == 0:
            raise ToolError(f"old text not found in {path}; read_file shows the exact text (mind indentation)")
        if count > 1:
            lines = [text[: i].count("\n") + 1 for i in _find_all(text, old)]
            raise ToolError(f"old text occurs {count} times in {path} (lines {lines[:10]}): include more "
                            "surrounding lines so it is unique")
        rel = self._rel(p)
        self.originals.setdefault(rel, text)
        write_file(p, text.replace(old, new, 1))
        return f"edited {rel}: replaced {old.count(chr(10)) + 1} line(s) with {new.count(chr(10)) + 1}"

    @tool
    def run_tests(self, selector: str = "") -> str:
        """Run tests in the sandbox: test files or node ids separated by spaces (default: the failing tests
        named in the problem statement). Shows the end of pytest's output.

        Args:
            selector: e.g. tests/test_x.py or tests/test_x.py::test_y
        """
        if self.ws is None:
            raise ToolError("the episode is over: no workspace")
        try:
            selectors = check_selectors(selector.split()) or self.fail_to_pass
        except ValueError as e:
            raise ToolError(str(e)) from None
        run = run_pytest(self.sandbox, self.ws, self.venv, self.repo.src_root, selectors, self.repo.pytest_args,
                         self.test_timeout_s)
        counts: dict[str, int] = {}
        for outcome in run.outcomes.values():
            counts[outcome] = counts.get(outcome, 0) + 1
        self._last_tests = {"selectors": selectors, "counts": counts, "status": run.status}
        summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "no tests ran"
        out = run.output.replace("/work/repo/", "")
        if len(out) > MAX_TEST_OUTPUT:
            out = "[...]\n" + out[-MAX_TEST_OUTPUT:]
        status = "" if run.status in ("ok", "error") else f" (run {run.status})"
        return f"{summary}{status}\n{out}"

    @tool(final=True)
    def submit(self) -> str:
        """Submit the current state of the repository as your fix; the tests decide the score."""
        if self.ws is None:
            return ""
        return "".join(unified_diff(rel, old, (self.ws / rel).read_text(encoding="utf-8"))
                       for rel, old in sorted(self.originals.items()))


def swe_gold_plan(patch: str) -> list[ToolCall]:
    """Tool calls that apply a unified diff by hand: for each hunk read the lines around it and replace
    its old lines (context included, so the text is unique) with its new lines; then run the failing
    tests and submit."""
    from unidiff import PatchSet

    calls: list[ToolCall] = []
    for pfile in PatchSet(patch):
        path = pfile.path
        for hunk in pfile:
            old = "".join(line.value for line in hunk if not line.is_added)
            new = "".join(line.value for line in hunk if not line.is_removed)
            calls.append(ToolCall("read_file", {"path": path, "start": max(1, hunk.source_start - 5),
                                                "end": hunk.source_start + hunk.source_length + 5}))
            calls.append(ToolCall("edit", {"path": path, "old": old, "new": new}))
    calls.append(ToolCall("run_tests", {"selector": ""}))
    calls.append(ToolCall("submit", {}))
    return calls


def _find_all(text: str, sub: str) -> list[int]:
    out, i = [], text.find(sub)
    while i != -1:
        out.append(i)
        i = text.find(sub, i + 1)
    return out
