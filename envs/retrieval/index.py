"""Build, persist and reload any index by kind; indexes reload without re-encoding."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from sleuth.envs.retrieval.base import Retriever, read_meta
from sleuth.envs.retrieval.bm25 import BM25Index
from sleuth.envs.retrieval.corpus import Doc
from sleuth.envs.retrieval.dense import DenseIndex
from sleuth.envs.retrieval.hybrid import HybridIndex

KINDS = ("bm25", "dense", "hybrid")


def build_index(docs: list[Doc], kind: str = "bm25", backend: str = "bm25s", progress: bool = True) -> Retriever:
    if kind == "bm25":
        return BM25Index(docs, backend=backend, progress=progress)
    if kind == "dense":
        return DenseIndex(docs, progress=progress)
    if kind == "hybrid":
        return HybridIndex.build(docs, progress=progress, backend=backend)
    raise ValueError(f"unknown index kind {kind!r}; known: {', '.join(KINDS)}")


def load_index(path: str | Path) -> Retriever:
    kind = read_meta(Path(path))["kind"]
    return {"bm25": BM25Index, "dense": DenseIndex, "hybrid": HybridIndex}[kind].load(path)


def save_index(index: Retriever, out: str | Path, replace: bool = False) -> None:
    """Write `index` to `out` whole or not at all: built in a sibling directory, then renamed into place, so
    a killed build never leaves half an index where a good one was. An existing non-empty `out` is kept
    (`FileExistsError`) unless `replace`."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not replace:
        what = "an index" if (out / "meta.json").exists() else "files"
        raise FileExistsError(f"{out} already holds {what}: pass --force to replace it, or choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        index.save(tmp)
        if out.exists():
            old = out.with_name(f".{out.name}.old-{tmp.name}")
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old) if old.is_dir() else old.unlink()
        else:
            tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
