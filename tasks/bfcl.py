"""BFCL v4 items as Tasks: `bfcl:<category>`, `bfcl:<category>,<category>`, `bfcl:all` (every category that runs
offline), `bfcl:multi_turn` / `bfcl:single_turn`, each optionally `:train` or `:test` (the family's split) and then
`:N` (the first N items of each category), and a row range as for any source (`bfcl:simple_python[0:50]`: BFCL ids
`simple_python_0` … `simple_python_49`). `bfcl:single_turn:test:20` is 20 held-out items of each category.

The items are read with bfcl-eval's own loaders (`load_dataset_entry`, `load_ground_truth_entry`), so a task holds
exactly the entry `bfcl generate` would send: the function docs with BFCL's language hints, the multi-turn
backends' docs with the held-out functions of `miss_func` moved to `missed_function`. Task ids are BFCL's ids.

Only bfcl-eval's data and its pure-Python loaders are needed here (its wheel, installed `--no-deps` in the main
venv); its checkers and backends run where the family's env runs (`envs/families/bfcl.py`).

The split holds out whole scenarios: the `miss_func`, `miss_param` and `long_context` variants are built row by row
on the 200 scenarios of `multi_turn_base` (`multi_turn_<variant>_<n>` is scenario n), so a multi-turn item's split
is decided by its scenario number, the same for all four variants; a single-turn item's by its question (BFCL asks
some questions in more than one item). A fixed hash puts one scenario in four in `test`."""

from __future__ import annotations

import bisect
import dataclasses
import functools
import hashlib
import itertools
import json
import os
from pathlib import Path
from typing import Any

from sleuth.core.errors import BadInput
from sleuth.tasks.base import Task, normalise_question

# The scoring categories of BFCL v4 that run offline, in the leaderboard's column order (`constants/column_headers.py`:
# non-live, live, multi-turn). Not here: web_search (calls a search API over the network); memory (its items read
# a memory the same model wrote in prerequisite conversations run before them, and memory_vector loads a
# sentence-transformers model from the hub); format_sensitivity (not scored by the leaderboard).
NON_LIVE = ("simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple",
            "irrelevance")
LIVE = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple", "live_irrelevance",
        "live_relevance")
MULTI_TURN = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
CATEGORIES = NON_LIVE + LIVE + MULTI_TURN
GROUPS = {"all": CATEGORIES, "single_turn": NON_LIVE + LIVE, "non_live": NON_LIVE, "live": LIVE,
          "multi_turn": MULTI_TURN}
NOT_OFFLINE = {"web_search": "it calls a web search API over the network",
               "memory": "its items read what the same model stored in prerequisite conversations, and memory_vector "
                         "loads a sentence-transformers model from the hub",
               "format_sensitivity": "the leaderboard does not score it"}
SPLITS = ("train", "test")
TEST_SHARE = 4  # one scenario in TEST_SHARE is held out
MIN_PROBE = 16  # the shortest question looked for inside others, as `tasks.holdout.check_texts` looks


class BFCLDataError(BadInput):
    """A `bfcl:` spec names no category BFCL v4 has offline, or bfcl-eval's data is not installed."""


def category_of(item_id: str) -> str:
    """`multi_turn_base_17` → `multi_turn_base`, `live_simple_3-2-0` → `live_simple` (BFCL's own rule)."""
    return item_id.rsplit("_", 1)[0]


def is_multi_turn(category: str) -> bool:
    return category.startswith("multi_turn")


def scenario_of(item_id: str, question: str = "") -> str:
    """What an item is built on: `multi_turn:<n>` for every multi-turn variant of row n; for a single-turn item its
    question (normalised as the held-out check compares questions: BFCL asks some questions in several items and
    categories, e.g. `simple_python_12` and a `live_simple` item), else its id."""
    category, _, index = item_id.rpartition("_")
    if is_multi_turn(category):
        return f"multi_turn:{index}"
    return f"question:{normalise_question(question)}" if question.strip() else item_id


def _hashed_test(scenario: str) -> bool:
    return hashlib.sha256(scenario.encode()).digest()[0] % TEST_SHARE == 0


@functools.cache
def held_out_scenarios() -> frozenset[str]:
    """The scenarios in `test`: those the hash puts there, closed under containment — a scenario whose question or
    answer holds a held-out question (BFCL's live items reuse requests: `live_simple_53-24-0` asks to create a todo
    "go for shopping at 9 pm", `live_irrelevance_171-25-0` is that request) is held out too, as the held-out check
    of training data compares questions and finds them inside records (`tasks/holdout.py`)."""
    texts: dict[str, list[str]] = {}
    questions: dict[str, set[str]] = {}
    for category in CATEGORIES:
        for task in _category(category):
            scenario = scenario_of(task.id, task.question)
            texts.setdefault(scenario, []).append(normalise_question(
                f"{task.question} {json.dumps(task.payload['ground_truth'])}"))
            questions.setdefault(scenario, set()).add(normalise_question(task.question))
    test = {s for s in texts if _hashed_test(s)}
    while True:  # one search per held-out question through every other scenario's text at once
        others = [s for s in texts if s not in test]
        joined = "\n".join(" ".join(texts[s]) for s in others)
        starts = list(itertools.accumulate((len(" ".join(texts[s])) + 1 for s in others), initial=0))
        grown = set()
        for q in {q for s in test for q in questions[s] if len(q) >= MIN_PROBE}:
            at = joined.find(q)
            while at >= 0:
                grown.add(others[bisect.bisect_right(starts, at) - 1])
                at = joined.find(q, at + 1)
        if not grown:
            return frozenset(test)
        test |= grown


def split_of(task: Task) -> str:
    return "test" if scenario_of(task.id, task.question) in held_out_scenarios() else "train"


def _bfcl_utils() -> Any:
    """bfcl-eval's loaders. Importing its constants creates `result/`, `score/` and `.file_locks/` under
    $BFCL_PROJECT_ROOT (default: beside site-packages); they go to sleuth's cache unless the user set it."""
    os.environ.setdefault("BFCL_PROJECT_ROOT", str(Path.home() / ".cache" / "sleuth" / "bfcl"))
    try:
        from bfcl_eval import utils
    except ImportError as e:
        raise BFCLDataError(f"bfcl: tasks need the bfcl-eval wheel ({e.name} is not importable): `make setup` "
                            "installs it (pip install --no-deps bfcl-eval==2026.3.23)") from None
    return utils


def parse_spec(spec: str) -> tuple[list[str], str | None, int | None]:
    """`multi_turn_base,simple_python:test:20` → (categories, split or None, items per category or None)."""
    names, _, rest = spec.partition(":")
    split, _, count = rest.partition(":")
    if names in SPLITS and not split:  # `bfcl:test`: every category's held-out items (what training stays off)
        names, split = "all", names
    if split and split not in SPLITS:
        raise BFCLDataError(f"bfcl:{spec}: the split is 'train' or 'test', not {split!r}")
    if count and not (count.isdigit() and int(count) > 0):
        raise BFCLDataError(f"bfcl:{spec}: the last part is a number of items per category, not {count!r}")
    categories: list[str] = []
    for name in filter(None, names.split(",")):
        if name in GROUPS:
            categories += GROUPS[name]
        elif name in CATEGORIES:
            categories.append(name)
        else:
            why = next((f" ({k} does not run offline: {v})" for k, v in NOT_OFFLINE.items() if name.startswith(k)), "")
            raise BFCLDataError(f"bfcl:{name} is not a BFCL v4 category that runs here{why}; the categories: "
                                f"{', '.join(CATEGORIES)}; groups: {', '.join(GROUPS)}")
    if not categories:
        raise BFCLDataError("bfcl: name a category or a group (e.g. bfcl:multi_turn_base, bfcl:all)")
    return list(dict.fromkeys(categories)), split or None, int(count) if count else None


def item_task(entry: dict[str, Any], ground_truth: Any, source_types: dict[str, Any] | None = None) -> Task:
    """One BFCL item. `payload.entry` is what the model is shown (its turns, function docs and backends' starting
    state); `payload.ground_truth` is BFCL's possible answer (a label: only the checker and the oracle read it);
    `payload.source_types` (Java and JavaScript items): each parameter's type before BFCL declared it a string
    holding a literal, as (type, item type) — what its checker parses the literal as."""
    first = entry["question"][0] if entry["question"] else []
    question = "\n".join(m["content"] for m in first if m.get("role") == "user")
    payload = {"entry": entry, "ground_truth": ground_truth}
    if source_types:
        payload["source_types"] = source_types
    return Task(id=entry["id"], question=question, payload=payload, source=f"bfcl/{category_of(entry['id'])}")


def _source_types(entry: dict[str, Any]) -> dict[str, dict[str, tuple[str, str | None]]]:
    return {f["name"]: {p: (v["type"], (v.get("items") or {}).get("type")) for p, v in
                        f["parameters"]["properties"].items()} for f in entry["function"]}


@functools.cache
def _category(category: str) -> tuple[Task, ...]:
    utils = _bfcl_utils()
    entries = utils.load_dataset_entry(category)
    if "irrelevance" in category or category == "live_relevance":  # relevance items have no possible answer
        truths: dict[str, Any] = {}
    else:
        truths = {t["id"]: t["ground_truth"] for t in utils.load_ground_truth_entry(category)}
    literal = category in ("simple_java", "simple_javascript")
    originals = ({e["id"]: _source_types(e) for e in utils.load_dataset_entry(
        category, include_language_specific_hint=False)} if literal else {})
    return tuple(item_task(e, truths.get(e["id"]), originals.get(e["id"])) for e in entries)


def load_category(category: str) -> list[Task]:
    """A category's items, their split set (new Task objects; the payloads, read-only data, are shared)."""
    return [dataclasses.replace(t, split=split_of(t)) for t in _category(category)]


def load_bfcl(path: Path | None, spec: str) -> list[Task]:
    """The task loader of `bfcl:` (`path` is unused: the data ships in bfcl-eval's wheel)."""
    categories, split, per_category = parse_spec(spec)
    out = []
    for c in categories:
        out += [t for t in load_category(c) if split is None or t.split == split][:per_category]
    return out
