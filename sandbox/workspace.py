"""Workspaces: a private, writable copy of a clean repository for one episode or one verification, and
unified diffs in and out of it.

A workspace is made of hard links to the clean copy by default (one link per file: ~10x faster than
copying, see bench/swe.py). That is safe because nothing writes a file in place: `write_file` replaces
a file by rename, `git apply` and `patch` write new files too (tested), and sandboxed test runs see the
workspace read-only."""

from __future__ import annotations

import difflib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

from sleuth.core.errors import BadInput

MODES = ("hardlink", "copy")
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".tox", ".git")


class PatchError(BadInput):
    """A diff that cannot be applied; the message says why (for a verdict, never a crash)."""


def make_workspace(clean: Path, dest: Path | None = None, mode: str = "hardlink") -> Path:
    if mode not in MODES:
        raise ValueError(f"workspace mode must be one of {MODES}, not {mode!r}")
    dest = Path(dest) if dest else Path(tempfile.mkdtemp(prefix="sleuth-ws-")) / "repo"
    copy = os.link if mode == "hardlink" else shutil.copy2
    shutil.copytree(clean, dest, symlinks=True, ignore=_SKIP, copy_function=copy, dirs_exist_ok=True)
    return dest


def remove_workspace(ws: Path) -> None:
    """Remove a workspace made by `make_workspace` (and its private parent folder)."""
    ws = Path(ws)
    parent = ws.parent
    shutil.rmtree(ws, ignore_errors=True)
    if parent.name.startswith("sleuth-ws-"):
        shutil.rmtree(parent, ignore_errors=True)


def resolve(root: Path, rel: str) -> Path:
    """`root/rel`, refusing paths that leave `root` (absolute, '..', or through a symlink)."""
    if not isinstance(rel, str) or "\x00" in rel:
        raise PermissionError(f"not a path: {rel!r}")
    rel = rel.strip() or "."
    if os.path.isabs(rel):
        raise PermissionError(f"{rel!r} is absolute: give a path relative to the repository root")
    base = Path(root).resolve()
    path = (base / rel).resolve()
    if path != base and base not in path.parents:
        raise PermissionError(f"{rel!r} is outside the repository")
    return path


def write_file(path: Path, text: str) -> None:
    """Replace a file by rename (never in place: its old inode may be shared with the clean copy)."""
    tmp = path.with_name(f".{path.name}.sleuth-tmp")
    tmp.write_text(text, encoding="utf-8")
    if path.exists():
        shutil.copymode(path, tmp)
    os.replace(tmp, path)


def unified_diff(rel: str, old: str, new: str) -> str:
    """A git-style unified diff of one file (a/ and b/ prefixes, 3 lines of context)."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    lines = list(difflib.unified_diff(a, b, f"a/{rel}", f"b/{rel}", n=3))
    if not lines:
        return ""
    out = [f"diff --git a/{rel} b/{rel}\n"]
    for line in lines:
        if line.endswith("\n"):
            out.append(line)
        else:  # the file's last line has no newline: say so the way diff and git do
            out.append(line + "\n\\ No newline at end of file\n")
    return "".join(out)


def diff_trees(base: Path, ws: Path, paths: Iterable[str]) -> str:
    """The diff that turns `base` into `ws`, over the given relative paths (files edited)."""
    parts = []
    for rel in sorted(set(paths)):
        old = (base / rel).read_text(encoding="utf-8") if (base / rel).is_file() else ""
        new = (ws / rel).read_text(encoding="utf-8") if (ws / rel).is_file() else ""
        parts.append(unified_diff(rel, old, new))
    return "".join(parts)


def check_diff(diff: str) -> None:
    if not isinstance(diff, str):
        raise PatchError(f"a patch must be text, got {type(diff).__name__}")
    if "GIT binary patch" in diff or "Binary files " in diff:
        raise PatchError("binary patches are not accepted")
    for line in diff.splitlines():
        if line.startswith(("new file mode 120000", "old mode", "new mode")) or line.startswith("new file mode 12"):
            raise PatchError("patches that create symlinks or change file modes are not accepted")


def apply_patch(ws: Path, diff: str, timeout_s: float = 30.0) -> str:
    """Apply a unified diff (-p1) to a workspace: `git apply` (all or nothing), else `patch` with fuzz
    after a dry run, as SWE-bench's harness does, but with --forward: `patch --batch` alone applies a
    patch that looks reversed in reverse, which would turn a resubmitted bug into its fix. Returns which
    tool applied it; raises PatchError."""
    check_diff(diff)
    if not diff.strip():
        raise PatchError("the patch is empty")
    if not diff.endswith("\n"):
        diff += "\n"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
           "GIT_CEILING_DIRECTORIES": str(Path(ws).resolve().parent)}  # never use an enclosing git repo
    with tempfile.NamedTemporaryFile("w", suffix=".diff", delete=False, encoding="utf-8") as f:
        f.write(diff)
        name = f.name
    try:
        errors = []
        git = shutil.which("git")
        if git:
            r = _run([git, "apply", "--whitespace=nowarn", "-p1", name], ws, env, timeout_s)
            if r.returncode == 0:
                return "git apply"
            errors.append(("git apply", r))
        patch = shutil.which("patch")
        if patch:
            opts = [patch, "--batch", "--forward", "--fuzz=5", "-p1", "--no-backup-if-mismatch", "-r", "-"]
            dry = _run([*opts, "--dry-run", "-i", name], ws, env, timeout_s)
            if dry.returncode == 0:
                r = _run([*opts, "-i", name], ws, env, timeout_s)
                if r.returncode == 0:
                    return "patch"
                errors.append(("patch", r))
            else:
                errors.append(("patch --dry-run", dry))
        if not errors:
            raise PatchError("neither git nor patch is installed: cannot apply a diff")
        detail = "; ".join(f"{tool}: {(r.stderr or r.stdout).strip()[-300:]}" for tool, r in errors)
        raise PatchError(f"the patch does not apply: {detail}")
    finally:
        os.unlink(name)


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"timed out after {timeout_s} s")


def touched_files(diff: str) -> list[str]:
    """Relative paths a unified diff changes (its b/ side; a/ for deletions)."""
    out = []
    for line in diff.splitlines():
        if line.startswith("+++ ") or line.startswith("--- "):
            name = line[4:].split("\t", 1)[0].strip()
            if name == "/dev/null":
                continue
            if name.startswith(("a/", "b/")):
                name = name[2:]
            out.append(name)
    return list(dict.fromkeys(out))
