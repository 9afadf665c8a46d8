"""Batch scoring of JSONL records: each input line is a task record in its data set's own layout plus a
`response`; each output line is the record with `score` and `details` added. Every input line gives an
output line, in order: a line that cannot be scored (blank, bad JSON, bad UTF-8, wrong fields) carries
`score: null`, an `error` and its raw text, and the rest go on. Scoring is `registry.verdict`, the path the TRL / verl /
OpenRLHF adapters and the verifier server use, so one record scores the same everywhere."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sleuth.verifiers.base import CannotScore, Verdict
from sleuth.verifiers.judge.judges import PointwiseJudge
from sleuth.verifiers.registry import get_verifier, verdict


def _score_line(verifier: Callable[[dict, str], Verdict], number: int, raw: bytes) -> dict[str, Any]:
    if not raw.strip():  # still a line: output line N stays the verdict of input line N
        return {"line": number, "score": None, "error": "a blank line holds no record"}
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return {"line": number, "score": None, "error": f"not UTF-8 (byte {e.start})",
                "raw": raw.decode("utf-8", errors="replace")}
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as e:
        msg = e.msg if isinstance(e, json.JSONDecodeError) else "unreadable"
        return {"line": number, "score": None, "error": f"not valid JSON: {msg}", "raw": line}
    if not isinstance(record, dict):
        return {"line": number, "score": None, "error": "a record must be a JSON object"}
    if not isinstance(record.get("response"), str):
        return {**record, "score": None, "error": "the record has no string 'response' field"}
    try:
        verdict = verifier(record, record["response"])
    except (KeyError, TypeError, ValueError, CannotScore) as e:
        return {**record, "score": None, "error": f"cannot score this record: {type(e).__name__}: {e}"}
    return {**record, "score": verdict.score, "details": verdict.details}


def score_lines(verifier: Callable[[dict, str], Verdict], lines: list[bytes],
                workers: int = 2) -> Iterator[dict[str, Any]]:
    """Scored records in input order, one for every line (a blank one gets `score: null` and an `error`)."""
    numbered = [(i + 1, line) for i, line in enumerate(lines)]
    with ThreadPoolExecutor(max(1, workers)) as pool:  # code verifiers wait on sandbox subprocesses
        yield from pool.map(lambda item: _score_line(verifier, *item), numbered)


def score_file(name: str, input_path: str | Path, out_path: str | Path, workers: int = 2,
               progress: bool = True, extract: bool = True) -> dict[str, Any]:
    """Score every line of `input_path` into `out_path` (never the same file: the input is kept whole)."""
    from tqdm import tqdm

    if Path(out_path).exists() and Path(out_path).resolve() == Path(input_path).resolve():
        raise ValueError(f"--out {out_path} is the input file: scoring would overwrite it; write elsewhere")
    get_verifier(name)  # an unknown name fails before the output is opened

    def verifier(record: dict, response: str) -> Verdict:
        return verdict(name, record, response, extract)

    lines = Path(input_path).read_bytes().splitlines()
    scores: list[float] = []
    errors = 0
    with open(out_path, "w", encoding="utf-8") as out, tqdm(total=len(lines),
                                                            desc=f"score {name}", disable=not progress) as bar:
        for rec in score_lines(verifier, lines, workers):
            out.write(json.dumps(rec, ensure_ascii=False) + "\n")
            if rec.get("score") is None:
                errors += 1
            else:
                scores.append(rec["score"])
            bar.update(1)
    out = {"verifier": name, "scored": len(scores), "errors": errors,
           "mean_score": round(sum(scores) / len(scores), 4) if scores else None, "out": str(out_path)}
    judge = get_verifier(name)
    if isinstance(judge, PointwiseJudge):  # its calls, cache hits, tokens and latency
        out["judge"] = judge.take_stats().metrics()
    return out
