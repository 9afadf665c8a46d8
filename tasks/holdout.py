"""Held-out data never reaches training. Training data (RL tasks, SFT demonstrations, chat records) is
checked against the evaluation splits before anything trains: the `test` split of the training source
(training on it is refused outright) and any evaluation file the run names. Overlap is found by task id
and by question text (lower-cased, punctuation and spacing collapsed), so a renamed id or a question
pasted into a chat record is caught as well."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from sleuth.core.errors import BadInput
from sleuth.tasks.base import Task, normalise_question

HELD_OUT_SPLIT = "test"
_SHOWN = 3  # overlapping items named in the error


class LeakageError(BadInput):
    """Training data contains held-out (evaluation) data."""



def held_out_specs(train_spec: str, extra: Iterable[str | None] = ()) -> list[str]:
    """Task specs training on `train_spec` must stay disjoint from; refuses training on a test split."""
    from sleuth.tasks.registry import parse_slice

    base = parse_slice(train_spec)[0]  # a range of a test split is a test split
    if ":" not in base and Path(base).is_file():  # a plain Task JSONL: no source, so no source test split
        base = f":{base}"
    name, _, rest = base.partition(":")
    split = Path(rest).stem if rest else ""
    if split == HELD_OUT_SPLIT:
        raise LeakageError(f"{train_spec} is a held-out test split: train on train/dev splits, evaluate on test")
    specs = [f"{name}:{HELD_OUT_SPLIT}"] if name else []
    specs += [s for s in extra if s]
    return list(dict.fromkeys(specs))


def load_held_out(specs: Sequence[str]) -> list[Task]:
    """The tasks of every spec that exists (a source without a test split has nothing to hold out)."""
    from sleuth.tasks.registry import load_tasks

    out: list[Task] = []
    for spec in specs:
        try:
            out += load_tasks(spec)
        except FileNotFoundError:
            continue
    return out


def check_tasks(train: Sequence[Task], held_out: Sequence[Task], what: str) -> None:
    """Refuse training tasks whose id or question is a held-out task's."""
    ids = {t.id: t for t in held_out}
    questions = {normalise_question(t.question): t for t in held_out if t.question.strip()}
    bad = [t.id for t in train if t.id in ids or normalise_question(t.question) in questions]
    if bad:
        raise LeakageError(f"{what}: {len(bad)} task(s) are held-out evaluation tasks "
                           f"(e.g. {', '.join(bad[:_SHOWN])}); "
                           "remove them from the training data")


def check_texts(items: Sequence[tuple[str, str]], held_out: Sequence[Task], what: str) -> None:
    """Refuse training records (id, text) whose id is a held-out task's or whose text contains a held-out
    question (a demonstration or chat record built on an evaluation question)."""
    ids = {t.id for t in held_out}
    questions = [q for q in (normalise_question(t.question) for t in held_out) if len(q) >= 16]  # no tiny probes
    bad = []
    for key, text in items:
        norm = normalise_question(text)
        if key in ids or any(q in norm for q in questions):
            bad.append(key)
    if bad:
        raise LeakageError(f"{what}: {len(bad)} record(s) hold held-out evaluation questions (e.g. "
                           f"{', '.join(bad[:_SHOWN])}); remove them from the training data")
