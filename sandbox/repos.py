"""Real repositories from PyPI source distributions: fetch an sdist with pip, unpack it once into a clean
copy, and build the virtual environment its test suite runs in (the system interpreter, so a sandboxed
uid can run it, plus the test dependencies). Everything is cached under `$SLEUTH_CACHE/swe` (default
`~/.cache/sleuth/swe`) and built under a file lock, so concurrent processes share one copy."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sleuth.core.errors import InfraFailure
from sleuth.sandbox.runner import _system_python


class RepoError(InfraFailure):
    """A repository or its environment could not be built; the message says what is missing."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class RepoSpec:
    """What is needed to rebuild a package's repository and run its tests. `src_root` is the folder put
    on `sys.path` ("src" for a src layout); `sha256` pins the sdist the tasks were built from."""

    name: str
    version: str
    src_root: str = "."
    test_deps: tuple[str, ...] = ("pytest",)
    pytest_args: tuple[str, ...] = ()
    sha256: str = ""
    filename: str = ""

    @property
    def key(self) -> str:
        return f"{canonical(self.name)}-{self.version}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "src_root": self.src_root,
                "test_deps": list(self.test_deps), "pytest_args": list(self.pytest_args),
                "sha256": self.sha256, "filename": self.filename}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RepoSpec:
        return cls(name=d["name"], version=str(d["version"]), src_root=d.get("src_root") or ".",
                   test_deps=tuple(d.get("test_deps") or ("pytest",)),
                   pytest_args=tuple(d.get("pytest_args") or ()), sha256=d.get("sha256") or "",
                   filename=d.get("filename") or "")


def default_cache() -> Path:
    base = os.environ.get("SLEUTH_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "sleuth")
    return Path(base) / "swe"


@dataclass
class RepoCache:
    root: Path = field(default_factory=default_cache)
    python: str = field(default_factory=_system_python)

    def __post_init__(self) -> None:
        self.root = Path(self.root)

    # -- the clean source ---------------------------------------------------------------------------
    def source(self, spec: RepoSpec) -> Path:
        """The unpacked sdist (never edit it: workspaces hard-link its files)."""
        dest = self.root / "repos" / spec.key
        if dest.is_dir():
            return dest
        with self._lock(spec.key):
            if dest.is_dir():
                return dest
            archive = self.sdist(spec)
            tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest.parent))
            try:
                _unpack(archive, tmp)
                tops = [p for p in tmp.iterdir()]
                top = tops[0] if len(tops) == 1 and tops[0].is_dir() else tmp
                for d in top.rglob("__pycache__"):
                    shutil.rmtree(d, ignore_errors=True)
                top.rename(dest)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return dest

    def sdist(self, spec: RepoSpec) -> Path:
        """The source distribution, fetched with pip (from the configured index) on first use."""
        folder = self.root / "sdists" / spec.key
        found = _archives(folder)
        if not found:
            folder.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                   "--disable-pip-version-check", "-d", str(folder), f"{spec.name}=={spec.version}"]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            found = _archives(folder)
            if proc.returncode != 0 or not found:
                raise RepoError(f"pip could not fetch the sdist of {spec.name}=={spec.version}: "
                                f"{(proc.stderr or proc.stdout).strip()[-800:]}")
        archive = found[0]
        if spec.sha256 and sha256_of(archive) != spec.sha256:
            raise RepoError(f"{archive.name} has sha256 {sha256_of(archive)}, but the tasks were built from "
                            f"{spec.sha256}: the index serves a different file; rebuild the tasks")
        return archive

    # -- the test environment ---------------------------------------------------------------------
    def env(self, spec: RepoSpec) -> Path:
        """A venv with the test dependencies and without the package itself (the workspace provides it)."""
        deps = sorted(set(spec.test_deps))
        tag = hashlib.sha256(f"{self.python}|{os.path.realpath(self.python)}|{deps}".encode()).hexdigest()[:12]
        dest = self.root / "envs" / f"{spec.key}-{tag}"
        if (dest / ".complete").exists():
            return dest
        with self._lock(dest.name):
            if (dest / ".complete").exists():
                return dest
            shutil.rmtree(dest, ignore_errors=True)
            dest.parent.mkdir(parents=True, exist_ok=True)
            py = str(dest / "bin" / "python")
            steps = [[self.python, "-m", "venv", str(dest)],
                     [py, "-m", "pip", "install", "-q", "--disable-pip-version-check", *deps],
                     [py, "-m", "pip", "uninstall", "-y", "-q", spec.name]]
            for cmd in steps:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
                if proc.returncode != 0 and cmd is not steps[-1]:  # uninstalling an absent package is fine
                    shutil.rmtree(dest, ignore_errors=True)
                    raise RepoError(f"building the test environment of {spec.key} failed at "
                                    f"{' '.join(cmd[:4])}: {(proc.stderr or proc.stdout).strip()[-800:]}")
            (dest / ".complete").write_text(" ".join(deps))
        return dest

    @contextlib.contextmanager
    def _lock(self, name: str) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        for sub in ("repos", "sdists", "envs"):
            (self.root / sub).mkdir(exist_ok=True)
        with open(self.root / f".lock-{name}", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


def sha256_of(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _archives(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name.endswith((".tar.gz", ".zip", ".tgz", ".tar.bz2")))


def _unpack(archive: Path, dest: Path) -> None:
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            for member in z.namelist():
                target = (dest / member).resolve()
                if dest.resolve() not in target.parents and target != dest.resolve():
                    raise RepoError(f"{archive.name}: member {member!r} would land outside the folder")
            z.extractall(dest)
    else:
        with tarfile.open(archive) as t:
            t.extractall(dest, filter="data")  # refuses absolute paths, '..', device files, odd links

