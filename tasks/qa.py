"""Loaders for the multi-hop QA data sets (HotpotQA distractor, MuSiQue) into `Task`s.

Every record becomes a task whose payload lists its candidate documents (`docs`: title + text) and
the titles of the gold supporting documents (`supporting`). Files are JSONL, parquet or a saved `datasets`
directory (`tasks.records`); a hub name is passed through to `load_dataset` where a hub is reachable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sleuth.tasks.base import Task


def _load_records(path_or_name: str | Path, split: str | None = None) -> list[dict[str, Any]]:
    from sleuth.tasks.records import read_records

    return read_records(path_or_name, split)


def hotpotqa_task(rec: dict[str, Any], split: str = "") -> Task:
    """One HotpotQA record (Hugging Face `hotpot_qa/distractor` layout) as a Task."""
    ctx = rec["context"]
    docs = [{"title": t, "text": "".join(s).strip()} for t, s in zip(ctx["title"], ctx["sentences"], strict=True)]
    supporting = list(dict.fromkeys(rec["supporting_facts"]["title"]))
    return Task(
        id=str(rec["id"]),
        question=rec["question"],
        answer=rec["answer"],
        payload={"docs": docs, "supporting": supporting, "type": rec.get("type"), "level": rec.get("level")},
        split=split,
        source="hotpotqa",
    )


def musique_task(rec: dict[str, Any], split: str = "") -> Task:
    """One MuSiQue-Ans record as a Task (answer aliases kept as accepted answers)."""
    paras = sorted(rec["paragraphs"], key=lambda p: p["idx"])
    docs = [{"title": p["title"], "text": p["paragraph_text"].strip()} for p in paras]
    supporting = [p["title"] for p in paras if p["is_supporting"]]
    return Task(
        id=str(rec["id"]),
        question=rec["question"],
        answer=rec["answer"],
        aliases=list(rec.get("answer_aliases") or []),
        payload={"docs": docs, "supporting": supporting, "answerable": rec.get("answerable", True)},
        split=split,
        source="musique",
    )


def _convert(path: str | Path, split: str, to_task, kind: str) -> list[Task]:
    out = []
    for i, rec in enumerate(_load_records(path, split)):
        try:
            out.append(to_task(rec, split))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"record {i} of {path} is not in the {kind} layout ({type(e).__name__}: {e})") from e
    return out


def load_hotpotqa(path: str | Path, split: str = "") -> list[Task]:
    return _convert(path, split, hotpotqa_task, "HotpotQA")


def load_musique(path: str | Path, split: str = "") -> list[Task]:
    return _convert(path, split, musique_task, "MuSiQue")
