"""Hard-link files that two virtualenvs hold identically, so that the extra venvs cost little disk.

`make test` builds three venvs (the main one, vLLM's, verl's); each pins its own transformers, but all
three hold the same torch (754 MB) and many of the same libraries. CI machines here sometimes have only
a few GB free (a run failed with "No space left on device" while installing vLLM), so after each install
the Makefile links every file of DST's site-packages that is byte-identical to the same path in SRC's.

pip never writes into an installed file (it unlinks and writes anew), so a later upgrade in one venv
cannot change the other. A `.pyc` whose source was linked is replaced by SRC's (same interpreter magic
and flags): DST's own now records a source mtime that is no longer the source's, so Python would treat
it as stale, and the bodies differ only in the compile-time path, which the import system rewrites to
the real source path when it loads a `.pyc`.

Stdlib only: it runs with the system python before any venv exists. (util-linux's `hardlink` would
compare files but not handle the `.pyc` headers, and is not on every machine.)

Usage: python tools/share_venv_files.py SRC_VENV DST_VENV
"""

from __future__ import annotations

import filecmp
import os
import sys
from pathlib import Path

PYC_MAGIC_FLAGS = 8  # a .pyc header: magic, flags, source mtime, source size (PEP 552)


def site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise SystemExit(f"share_venv_files: no lib/python3*/site-packages under {venv}")
    return found[0]


def _same_interpreter(a: Path, b: Path) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read(PYC_MAGIC_FLAGS) == fb.read(PYC_MAGIC_FLAGS)


def _link(src: Path, dst: Path) -> None:
    tmp = dst.with_name(dst.name + ".sleuth-link")
    os.link(src, tmp)
    os.replace(tmp, dst)


def _source_of(pyc: Path) -> Path:
    return pyc.parent.parent / (pyc.name.split(".", 1)[0] + ".py")


def share(src_venv: Path, dst_venv: Path) -> tuple[int, int]:
    """Link DST's files to SRC's identical ones; returns (files linked, bytes saved)."""
    src_root, dst_root = site_packages(src_venv), site_packages(dst_venv)
    linked_sources: set[Path] = set()
    pycs: list[Path] = []
    n = saved = 0
    for dirpath, _, names in os.walk(dst_root):
        for name in names:
            dst = Path(dirpath) / name
            src = src_root / dst.relative_to(dst_root)
            if dst.is_symlink() or not src.is_file() or src.is_symlink():
                continue
            if os.path.samefile(src, dst):
                linked_sources.add(dst)
                continue
            if name.endswith(".pyc"):
                pycs.append(dst)  # after the sources: its rule depends on them
                continue
            if src.stat().st_size == dst.stat().st_size and filecmp.cmp(src, dst, shallow=False):
                saved += dst.stat().st_size
                _link(src, dst)
                linked_sources.add(dst)
                n += 1
    for dst in pycs:
        src = src_root / dst.relative_to(dst_root)
        if _source_of(dst) in linked_sources and _same_interpreter(src, dst):
            saved += dst.stat().st_size
            _link(src, dst)
            n += 1
    return n, saved


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    src, dst = (Path(a) for a in argv)
    try:
        n, saved = share(src, dst)
    except OSError as e:  # another filesystem, or no hard links there: the venvs still work unshared
        print(f"share_venv_files: not sharing {src} and {dst}: {e}", file=sys.stderr)
        return 0
    print(f"share_venv_files: {dst} shares {n} files ({saved / 2**20:.0f} MiB) with {src}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
