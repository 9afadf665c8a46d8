"""An index over a run's trajectory JSONL files, so a 100,000-episode run opens fast with bounded memory.

Per record it keeps the byte range of its line and the few fields the episode list sorts and filters by, in
compact arrays; a page of the list is answered from the index alone, an episode page reads its one line.
The index grows incrementally: each `refresh` reads only the bytes appended since the last one, in chunks,
so a live run's new episodes appear and a 1 GB file is never read whole into memory. A last line without
its newline (a run still writing it) waits for the next refresh; a complete line that is not a trajectory
record (torn, corrupt) is skipped and counted in `torn`.
"""

from __future__ import annotations

import json
import math
import threading
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHUNK = 8 << 20  # bytes read per step of a refresh
# A record line longer than this is skipped and counted as torn: indexing it would hold it whole in memory (a
# 1 GB line, or a file of NUL bytes, is no trajectory sleuth writes).
MAX_LINE = 64 << 20


@dataclass
class Source:
    """One JSONL file of records; `step` is the training step its records belong to (None for an eval)."""

    path: Path
    step: int | None = None
    scanned: int = 0  # bytes up to the end of the last complete line seen
    lines: int = 0  # complete lines seen (records and torn lines)
    searched: int = 0  # bytes known to hold no newline after `scanned` (a long or half-written last line)


def row_fields(d: dict[str, Any]) -> tuple[str, str, float, float, int, int, str, str | None, int]:
    """The sort/filter fields of one trajectory record: task, group, score (NaN: unscored), reward, turns,
    policy tokens, stop reason, error, sample (-1: none)."""
    turns = d.get("turns") or []
    verdict = d.get("verdict")
    score = verdict.get("score") if isinstance(verdict, dict) else None
    sample = (d.get("meta") or {}).get("sample")
    return (str(d["task_id"]), str(d.get("group") or ""), float(score) if score is not None else math.nan,
            float(d.get("reward") or 0.0), len(turns), sum(len(t.get("action_ids") or ()) for t in turns),
            str(d.get("stop_reason") or ""), d.get("error"), int(sample) if isinstance(sample, int) else -1)


@dataclass
class RunIndex:
    """Every record of a run's sources, numbered in the order they were indexed (stable as the run grows)."""

    sources: list[Source] = field(default_factory=list)
    src: array = field(default_factory=lambda: array("i"))  # which source a record is in
    start: array = field(default_factory=lambda: array("q"))  # byte offset of its line
    length: array = field(default_factory=lambda: array("i"))  # bytes of its line, newline excluded
    lineno: array = field(default_factory=lambda: array("i"))  # its line in its file (torn lines counted)
    score: array = field(default_factory=lambda: array("d"))
    reward: array = field(default_factory=lambda: array("d"))
    turns: array = field(default_factory=lambda: array("i"))
    tokens: array = field(default_factory=lambda: array("i"))
    sample: array = field(default_factory=lambda: array("i"))
    stop: array = field(default_factory=lambda: array("H"))  # into `stop_names`
    task_id: list[str] = field(default_factory=list)
    group: list[str] = field(default_factory=list)
    stop_names: list[str] = field(default_factory=list)
    errors: dict[int, str] = field(default_factory=dict)  # record → error, failed records only
    torn: int = 0
    lock: threading.RLock = field(default_factory=threading.RLock)

    def __len__(self) -> int:
        return len(self.start)

    def add_source(self, path: Path, step: int | None = None) -> None:
        with self.lock:
            if all(s.path != path for s in self.sources):
                self.sources.append(Source(path, step))

    def pending(self) -> bool:
        """Whether some source holds bytes not indexed yet."""
        return any(_size(s.path) > max(s.scanned, s.searched) for s in self.sources)

    def refresh(self, max_bytes: int | None = None) -> int:
        """Index what was appended since the last refresh (at most about `max_bytes`); returns bytes consumed
        (0: nothing new, or only a half-written last line)."""
        consumed, budget = 0, max_bytes if max_bytes is not None else math.inf
        for k, s in enumerate(list(self.sources)):
            while budget > 0:
                used = self._scan(k, s)
                consumed += used
                budget -= used
                if used == 0:
                    break
        return consumed

    def _scan(self, k: int, s: Source) -> int:
        """One chunk of source `k` from where its last complete line ended; returns bytes consumed."""
        try:
            with open(s.path, "rb") as f:
                if s.searched > s.scanned:  # the line at `scanned` runs past a chunk: find its end first
                    return self._long_line(s, f)
                f.seek(s.scanned)
                chunk = f.read(CHUNK)
                if not chunk:
                    return 0
                end = chunk.rfind(b"\n")
                if end < 0:  # one line longer than what was read: look for its end without holding it
                    s.searched = s.scanned + len(chunk)
                    return self._long_line(s, f)
        except FileNotFoundError:
            return 0
        return self._index_lines(k, s, chunk, end)

    def _index_lines(self, k: int, s: Source, chunk: bytes, end: int) -> int:
        """Index the complete lines of `chunk` (read from `s.scanned`; `end`: its last newline)."""
        pos = lines = 0
        rows: list[tuple[int, int, tuple]] = []
        while pos <= end:
            nl = chunk.find(b"\n", pos)
            line = chunk[pos:nl]
            if line.strip():
                try:
                    fields = row_fields(json.loads(line.decode("utf-8", "replace")))
                    rows.append((s.scanned + pos, len(line), s.lines + lines, fields))
                except (ValueError, KeyError, TypeError, AttributeError):
                    self.torn += 1
            lines += 1
            pos = nl + 1
        with self.lock:
            for offset, n, no, f in rows:
                self._append(k, offset, n, no, f)
            s.scanned += end + 1
            s.searched = max(s.searched, s.scanned)
            s.lines += lines
        return end + 1

    def _long_line(self, s: Source, f: Any) -> int:
        """Look for the newline of the line at `s.scanned` from `s.searched` on, a chunk at a time, keeping
        nothing; once found, the line is indexed on the next scan if it is at most MAX_LINE bytes (read whole
        then), else skipped as torn. Returns bytes consumed (0: no newline yet, or the line is left to index)."""
        f.seek(s.searched)
        chunk = f.read(CHUNK)
        nl = chunk.find(b"\n")
        if nl < 0:
            s.searched += len(chunk)
            return 0 if not chunk else len(chunk)  # progress made; the end of the file: wait for more
        end = s.searched + nl  # the newline's offset
        if end - s.scanned <= MAX_LINE:
            s.searched = s.scanned  # short enough: read it whole on the next scan
            f.seek(s.scanned)
            return self._index_lines(self.sources.index(s), s, f.read(end - s.scanned + 1), end - s.scanned)
        with self.lock:
            self.torn += 1
            s.lines += 1
            consumed = end + 1 - s.scanned
            s.scanned = s.searched = end + 1
        return consumed

    def _append(self, k: int, offset: int, n: int, no: int, f: tuple) -> None:
        task, group, score, reward, turns, tokens, stop, error, sample = f
        if stop not in self.stop_names:
            self.stop_names.append(stop)
        if error is not None:
            self.errors[len(self.start)] = str(error)
        self.src.append(k)
        self.start.append(offset)
        self.length.append(n)
        self.lineno.append(no)
        self.score.append(score)
        self.reward.append(reward)
        self.turns.append(turns)
        self.tokens.append(tokens)
        self.sample.append(sample)
        self.stop.append(self.stop_names.index(stop))
        self.task_id.append(task)
        self.group.append(group)

    def line(self, i: int) -> bytes:
        """Record `i`'s line as written."""
        s = self.sources[self.src[i]]
        with open(s.path, "rb") as f:
            f.seek(self.start[i])
            return f.read(self.length[i])

    def record(self, i: int) -> dict[str, Any]:
        return json.loads(self.line(i).decode("utf-8", "replace"))

    def step(self, i: int) -> int | None:
        return self.sources[self.src[i]].step

    def row(self, i: int) -> dict[str, Any]:
        """Record `i` as a row of the episode list (the contract's `rows` item), from the index alone."""
        score = self.score[i]
        return {"i": i, "task_id": self.task_id[i], "group": self.group[i], "step": self.step(i),
                "score": None if math.isnan(score) else score, "reward": self.reward[i], "turns": self.turns[i],
                "tokens": self.tokens[i], "stop_reason": self.stop_names[self.stop[i]], "failed": i in self.errors,
                "error": self.errors.get(i), "sample": None if self.sample[i] < 0 else self.sample[i]}

    def matches(self, q: str) -> set[int]:
        """Records whose line holds `q` (case-insensitive; the line as JSON, so task id, stop reason, error and
        every text of the episode), read line by line in chunks."""
        needle = json.dumps(q.lower(), ensure_ascii=False)[1:-1].encode()
        found: set[int] = set()
        n = len(self)
        i = 0
        while i < n:
            k = self.src[i]
            j = i
            while j < n and self.src[j] == k and self.start[j] - self.start[i] < CHUNK:
                j += 1
            with open(self.sources[k].path, "rb") as f:
                f.seek(self.start[i])
                block = f.read(self.start[j - 1] + self.length[j - 1] - self.start[i]).lower()
            base = self.start[i]
            for r in range(i, j):
                if block.find(needle, self.start[r] - base, self.start[r] - base + self.length[r]) >= 0:
                    found.add(r)
            i = j
        return found


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
