"""The database: every HotpotQA question of the shared files and its candidate paragraphs."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from sleuth.tasks import load_tasks, qa_docs

SCHEMA = """CREATE TABLE questions (id TEXT PRIMARY KEY, question TEXT, answer TEXT, type TEXT, level TEXT, split TEXT);
CREATE TABLE paragraphs (question_id TEXT, position INTEGER, title TEXT, is_supporting INTEGER, n_chars INTEGER);"""


def database(path: Path | None = None) -> Path:
    """Build the SQLite file once (a few thousand rows, well under a second) and reuse it."""
    cache = Path(os.environ.get("SLEUTH_CACHE", Path.home() / ".cache" / "sleuth"))
    path = Path(path or cache / "hotpot_sql.sqlite")
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    con = sqlite3.connect(tmp)
    con.executescript(SCHEMA)
    for split in ("train", "dev", "test"):
        for t in load_tasks(f"hotpotqa:{split}"):
            con.execute("INSERT INTO questions VALUES (?, ?, ?, ?, ?, ?)",
                        (t.id, t.question, t.answer, t.payload["type"], t.payload["level"], split))
            docs = qa_docs(t)
            gold = set(docs.supporting)
            con.executemany("INSERT INTO paragraphs VALUES (?, ?, ?, ?, ?)",
                            [(t.id, i, d.title, int(d.title in gold), len(d.text)) for i, d in enumerate(docs.docs)])
    con.commit()
    con.close()
    tmp.replace(path)
    return path
