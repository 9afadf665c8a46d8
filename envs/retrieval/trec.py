"""TREC run files that trec_eval parses: `qid Q0 docid rank score tag`, whitespace-separated, one ranking
per query id.

A TREC field cannot hold whitespace, and many corpora use titles as document ids (HotpotQA: "Tinted
Windows (album)"). Such ids are percent-encoded (`Tinted%20Windows%20(album)`, and `%` itself as `%25`),
the choice that keeps every other id as it is and is reversible (`urllib.parse.unquote`); qrels for such a
corpus need the same encoding (`trec_id`). A query id with whitespace is refused instead: it names the
user's own query, which the user can rename."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_WS = re.compile(r"\s")


def trec_id(doc_id: str) -> str:
    """A document id as one TREC field (percent-encoding only where it holds whitespace or `%`)."""
    if not _WS.search(doc_id) and "%" not in doc_id:
        return doc_id
    return "".join(f"%{ord(c):02X}" if _WS.match(c) or c == "%" else c for c in doc_id)


def unique_queries(queries: Sequence[tuple[str, str]]) -> tuple[list[tuple[str, str]], int]:
    """The first query of each id, in order, and how many repeats were dropped (SciFact's claims file
    lists a claim once per cited document: a run must rank each query id once)."""
    seen: set[str] = set()
    out = []
    for qid, text in queries:
        if _WS.search(qid) or not qid:
            raise ValueError(f"query id {qid!r} is empty or holds whitespace: a TREC run cannot carry it")
        if qid not in seen:
            seen.add(qid)
            out.append((qid, text))
    return out, len(queries) - len(out)


def write_run(path: str | Path, queries: Sequence[tuple[str, str]], results: Sequence[Sequence[Any]], tag: str) -> None:
    """One line per hit: ranks from 1, scores as given (descending within a query)."""
    if not tag or _WS.search(tag):
        raise ValueError(f"run tag {tag!r} must be one word")
    with open(path, "w", encoding="utf-8") as f:
        for (qid, _), hits in zip(queries, results, strict=True):
            for rank, hit in enumerate(hits, start=1):
                f.write(f"{qid} Q0 {trec_id(hit.id)} {rank} {hit.score:.6f} {tag}\n")
