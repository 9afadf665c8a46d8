"""The SWE building blocks without a package: mutations by hand, workspaces and diffs, pytest reports."""

import json
import os
import subprocess
import sys

import pytest

from sleuth.sandbox.pytest_run import check_selectors, parse_report
from sleuth.sandbox.workspace import (
    PatchError,
    apply_patch,
    diff_trees,
    make_workspace,
    resolve,
    touched_files,
    unified_diff,
    write_file,
)
from sleuth.synth.mutations import find_mutations, mutant_ok
from sleuth.synth.statements import failure_excerpt, leaks, normalise, problem_statement

SRC = '''"""Module docstring."""
LIMIT = 10


def clamp(x, lo, hi):
    """Docstring stays."""
    if x < lo:
        return lo
    total = x + 1
    return min(x, hi) if ok and ready else items[0:n]
'''


def test_each_operator_makes_the_expected_edit():
    by_op = {}
    for m in find_mutations("m.py", SRC):
        by_op.setdefault(m.op, []).append(m.apply(SRC))
    assert any("    if x <= lo:\n" in s for s in by_op["compare"])
    assert any("if ok or ready" in s for s in by_op["boolop"])
    assert any("items[0:n + 1]" in s for s in by_op["off_by_one"])
    assert any("total = x + 2" in s for s in by_op["constant"])
    assert any("min(hi, x)" in s for s in by_op["swap_args"])
    assert any("total = x + 1" not in s for s in by_op["remove_stmt"])
    assert any("return lo" not in s and "if x < lo" not in s for s in by_op["remove_return"])
    assert any("if not (x < lo):" in s for s in by_op["invert_if"])
    for variants in by_op.values():
        for s in variants:  # nothing outside function bodies changes, and the rest of the text is byte-identical
            assert s.startswith('"""Module docstring."""\nLIMIT = 10\n') and '"""Docstring stays."""' in s


def test_mutations_keep_formatting_outside_the_span():
    src = "def f(a, b):\n    # keep this comment\n    return a  <  b   # and this\n"
    (m,) = [m for m in find_mutations("f.py", src) if m.op == "compare"]
    assert m.apply(src) == "def f(a, b):\n    # keep this comment\n    return a  <=  b   # and this\n"
    assert m.line == 3 and m.end_line == 3 and m.function == "f"


def test_mutant_ok_rejects_syntax_errors_and_no_ops():
    assert not mutant_ok("def f():\n    return 1\n", "def f():\n")
    assert not mutant_ok("x = (1)\n", "x = 1\n")
    assert mutant_ok("x = 1\n", "x = 2\n")
    removal = [m for m in find_mutations("g.py", "def g():\n    y = 1\n") if m.op == "remove_stmt"]
    assert removal and not mutant_ok("def g():\n    y = 1\n", removal[0].apply("def g():\n    y = 1\n"))


def test_methods_and_nested_functions_get_qualified_names():
    src = "class A:\n    def m(self):\n        def inner():\n            return 1 < 2\n        return inner\n"
    names = {m.function for m in find_mutations("a.py", src)}
    assert names == {"A.m.inner"}  # `return inner` offers no mutation; the comparison is inner's
    assert find_mutations("bad.py", "def (:\n") == []


# -- workspaces and diffs -------------------------------------------------------------------------------
@pytest.fixture()
def clean(tmp_path):
    root = tmp_path / "clean"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("def add(a, b):\n    return a - b\n")
    (root / "pkg" / "nonl.py").write_text("x = 1")  # no newline at the end
    (root / "tests").mkdir()
    (root / "tests" / "test_mod.py").write_text("from pkg.mod import add\n\n"
                                                "def test_add():\n    assert add(1, 2) == 3\n")
    return root


@pytest.mark.parametrize("tool", ["git", "patch"])
def test_patches_never_write_through_hard_links(clean, tmp_path, tool, monkeypatch):
    ws = make_workspace(clean, tmp_path / "ws", mode="hardlink")
    assert os.stat(ws / "pkg" / "mod.py").st_ino == os.stat(clean / "pkg" / "mod.py").st_ino
    diff = unified_diff("pkg/mod.py", "def add(a, b):\n    return a - b\n", "def add(a, b):\n    return a + b\n")
    if tool == "patch":  # force the fallback
        monkeypatch.setattr("shutil.which", lambda name: None if name == "git" else f"/usr/bin/{name}")
    assert apply_patch(ws, diff) == ("git apply" if tool == "git" else "patch")
    assert (ws / "pkg" / "mod.py").read_text().endswith("a + b\n")
    assert (clean / "pkg" / "mod.py").read_text().endswith("a - b\n")
    write_file(ws / "pkg" / "nonl.py", "x = 2")
    assert (clean / "pkg" / "nonl.py").read_text() == "x = 1"


def test_diff_round_trip_with_a_missing_final_newline(clean, tmp_path):
    ws = make_workspace(clean, tmp_path / "ws")
    write_file(ws / "pkg" / "nonl.py", "x = 2")
    diff = diff_trees(clean, ws, ["pkg/nonl.py"])
    assert "\\ No newline at end of file" in diff and touched_files(diff) == ["pkg/nonl.py"]
    other = make_workspace(clean, tmp_path / "other")
    apply_patch(other, diff)
    assert (other / "pkg" / "nonl.py").read_text() == "x = 2"


@pytest.mark.parametrize("diff, why", [
    ("", "empty"),
    ("this is not a diff\n", "does not apply"),
    ("--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1,2 +1,2 @@\n-def nope():\n+def yes():\n     return a - b\n",
     "does not apply"),
    ("diff --git a/x b/x\nnew file mode 120000\n--- /dev/null\n+++ b/x\n@@ -0,0 +1 @@\n+/etc/passwd\n", "symlink"),
    ("diff --git a/x b/x\nGIT binary patch\nliteral 0\n", "binary"),
    ("--- a/../../etc/x\n+++ b/../../etc/x\n@@ -0,0 +1 @@\n+boom\n", "does not apply"),
])
def test_bad_patches_are_refused_with_a_reason(clean, tmp_path, diff, why):
    ws = make_workspace(clean, tmp_path / "ws")
    with pytest.raises(PatchError, match=why):
        apply_patch(ws, diff)
    assert (ws / "pkg" / "mod.py").read_text() == (clean / "pkg" / "mod.py").read_text()


def test_paths_cannot_leave_the_workspace(clean, tmp_path):
    ws = make_workspace(clean, tmp_path / "ws")
    (ws / "link").symlink_to("/etc")
    for bad in ("../clean", "/etc/passwd", "link/passwd", "pkg/../../clean", "a\x00b"):
        with pytest.raises(PermissionError):
            resolve(ws, bad)
    assert resolve(ws, "pkg/mod.py") == (ws / "pkg" / "mod.py").resolve()
    assert resolve(ws, "") == ws.resolve()


def test_copy_mode_makes_independent_files(clean, tmp_path):
    ws = make_workspace(clean, tmp_path / "ws", mode="copy")
    assert os.stat(ws / "pkg" / "mod.py").st_ino != os.stat(clean / "pkg" / "mod.py").st_ino
    with pytest.raises(ValueError, match="mode"):
        make_workspace(clean, tmp_path / "x", mode="overlay")


# -- pytest reports ---------------------------------------------------------------------------------------
def test_report_phases_merge_into_one_outcome_per_test():
    lines = [
        {"nodeid": "t.py::a", "when": "setup", "outcome": "passed"},
        {"nodeid": "t.py::a", "when": "call", "outcome": "passed", "duration": 0.5},
        {"nodeid": "t.py::a", "when": "teardown", "outcome": "passed", "duration": 0.1},
        {"nodeid": "t.py::b", "when": "setup", "outcome": "failed", "message": "fixture broke"},
        {"nodeid": "t.py::b", "when": "teardown", "outcome": "passed"},
        {"nodeid": "t.py::c", "when": "call", "outcome": "passed"},
        {"nodeid": "t.py::c", "when": "teardown", "outcome": "failed", "message": "cleanup broke"},
        {"nodeid": "t.py::d", "when": "call", "outcome": "skipped", "xfail": True},
        {"nodeid": "t.py::e", "when": "call", "outcome": "passed", "xfail": True},
        {"nodeid": "t.py::f", "when": "call", "outcome": "failed", "message": "assert 1 == 2",
         "frames": [{"path": "t.py", "lineno": 3, "lines": ["    assert f() == 2"]}]},
        {"nodeid": "t.py::f", "when": "teardown", "outcome": "failed", "message": "later"},
        {"nodeid": "t.py::g", "when": "setup", "outcome": "passed"},  # killed before its call: did not run
        {"collect_error": "t2.py", "message": "ImportError"},
    ]
    data = ("\n".join(json.dumps(x) for x in lines) + "\nnot json\n[1]\n").encode()
    outcomes, failures, errors, durations = parse_report(data)
    assert outcomes == {"t.py::a": "passed", "t.py::b": "error", "t.py::c": "error", "t.py::d": "xfailed",
                        "t.py::e": "xpassed", "t.py::f": "failed"}
    assert failures["t.py::f"]["message"] == "assert 1 == 2" and failures["t.py::b"]["when"] == "setup"
    assert errors == [{"nodeid": "t2.py", "message": "ImportError"}]
    assert durations["t.py::a"] == pytest.approx(0.6)


def test_selectors_cannot_be_options():
    assert check_selectors(["tests/x.py::t", " ", "tests/y.py"]) == ["tests/x.py::t", "tests/y.py"]
    for bad in ("-x", "--rootdir=/", "-p evil"):
        with pytest.raises(ValueError, match="not a test selector"):
            check_selectors([bad])


def test_the_report_plugin_records_a_real_pytest_run(tmp_path):
    (tmp_path / "test_s.py").write_text(
        "import pytest\n\ndef test_ok():\n    assert 1\n\ndef test_bad():\n    assert [1] == [2]\n\n"
        "@pytest.fixture\ndef boom():\n    raise RuntimeError('x')\n\ndef test_fix(boom):\n    pass\n")
    plugin_dir = os.path.join(os.path.dirname(__import__("sleuth.sandbox.pytest_run").sandbox.pytest_run.__file__))
    env = {**os.environ, "PYTHONPATH": plugin_dir, "SLEUTH_PYTEST_REPORT": str(tmp_path / "r.jsonl")}
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "pytest_report", "-p", "no:cacheprovider", "test_s.py"],
                   cwd=tmp_path, env=env, capture_output=True)
    outcomes, failures, _, _ = parse_report((tmp_path / "r.jsonl").read_bytes())
    assert outcomes == {"test_s.py::test_ok": "passed", "test_s.py::test_bad": "failed", "test_s.py::test_fix": "error"}
    assert "assert [1] == [2]" in failures["test_s.py::test_bad"]["message"]
    assert failures["test_s.py::test_bad"]["frames"][0]["path"] == "test_s.py"


# -- problem statements ----------------------------------------------------------------------------------
def test_statements_show_test_frames_only_and_never_the_library_line():
    failure = {"message": "IndexError: list index out of range", "frames": [
        {"path": "tests/test_it.py", "lineno": 12, "where": "in test_take",
         "lines": ["    assert take(2, xs) == [1, 2]"]},
        {"path": "pkg/it.py", "lineno": 40, "where": "in take", "lines": ["    return seq[n + 1]"]}]}
    text = problem_statement("pkg", "1.0", ["tests/test_it.py::test_take"], {"tests/test_it.py::test_take": failure})
    assert "tests/test_it.py:12: in test_take" in text and "assert take(2, xs)" in text
    assert "IndexError: list index out of range" in text and "seq[n + 1]" not in text and "pkg/it.py" not in text
    assert leaks(text, ["    assert take(2, xs) == [1, 2]"]) and not leaks(text, ["    return seq[n + 1]"])
    assert normalise("<f at 0x7f70f88dec00> /work/repo/pkg/a.py") == "<f at 0x…> pkg/a.py"
    assert failure_excerpt({}) == ""
