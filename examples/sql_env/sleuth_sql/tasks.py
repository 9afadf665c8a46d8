"""Questions about the database with their gold SQL, generated from its rows with a fixed seed. Each
template is a kind of question analysts ask; the gold answer is whatever the gold SQL returns."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

from sleuth.tasks import Task
from sleuth_sql.db import database

TEMPLATES = [
    ("How many {type} questions are in the {split} split?",
     "SELECT COUNT(*) FROM questions WHERE type = '{type}' AND split = '{split}'"),
    ("What is the answer to question {qid}?", "SELECT answer FROM questions WHERE id = '{qid}'"),
    ("Which paragraph titles support question {qid}?",
     "SELECT title FROM paragraphs WHERE question_id = '{qid}' AND is_supporting = 1"),
    ("In how many questions does a paragraph titled \"{title}\" appear?",
     "SELECT COUNT(DISTINCT question_id) FROM paragraphs WHERE title = '{title}'"),
    ("How long, in characters, is the longest paragraph of question {qid}?",
     "SELECT MAX(n_chars) FROM paragraphs WHERE question_id = '{qid}'"),
    ("How many questions of the {split} split have the answer \"yes\"?",
     "SELECT COUNT(*) FROM questions WHERE split = '{split}' AND answer = 'yes'"),
]


def build(n: int = 240, seed: int = 0) -> list[Task]:
    con = sqlite3.connect(database())
    qids = [r[0] for r in con.execute("SELECT id FROM questions ORDER BY id")]
    titles = [r[0] for r in con.execute("SELECT DISTINCT title FROM paragraphs "
                                        "WHERE title NOT LIKE '%''%' ORDER BY title")]
    rng = random.Random(seed)
    tasks, seen = [], set()
    for attempt in range(20 * n):  # bounded: small templates run out of new questions
        if len(tasks) == n:
            break
        i = attempt % len(TEMPLATES)
        question, sql = TEMPLATES[i]
        slots = {"type": rng.choice(["bridge", "comparison"]), "split": rng.choice(["train", "dev", "test"]),
                 "qid": rng.choice(qids), "title": rng.choice(titles)}
        q, gold = question.format(**slots), sql.format(**slots)
        if q in seen:
            continue
        seen.add(q)
        split = "test" if rng.random() < 0.25 else "train"
        tasks.append(Task(id=f"sql-{len(tasks)}", question=q, answer=gold, payload={"template": i},
                          split=split, source="hotpot_sql"))
    con.close()
    return tasks


def load(path: Path, split: str) -> list[Task]:
    """The sleuth task loader: `--tasks hotpot_sql:train` or `hotpot_sql:test` (the path is unused: the
    questions are generated from the database)."""
    return [t for t in build() if t.split == split]
