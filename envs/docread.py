"""DocRead (`sleuth/DocRead-v0`): the CIGPO setting. The agent sees a question and the titles of its
candidate paragraphs (10 for HotpotQA distractor, 20 for MuSiQue), reads up to `budget` of them (3 by
default), and answers. `info` records every read: its turn, the document, whether it is gold, whether it is a
re-read."""

from __future__ import annotations

from typing import Any

from sleuth.envs.outcome import ResetInfo
from sleuth.envs.parsers import ToolCall
from sleuth.envs.qa import QAEnv
from sleuth.envs.tools import ToolError, tool
from sleuth.tasks.base import Task
from sleuth.tasks.qa import qa_docs


class DocReadEnv(QAEnv):
    instructions = (
        "Answer the question. You see the titles of some documents; read the ones you need (each read "
        "shows you one document), then answer with a short phrase only: a name, a date, a number, or yes/no."
    )
    budget_unit = "reads"
    default_budget = 3

    @classmethod
    def oracle(cls, task: Task, turn: int, start: ResetInfo) -> ToolCall:
        """Read the supporting documents by number, in list order, then answer the gold answer."""
        plan = qa_docs(task).gold()
        return ToolCall("read", {"doc": plan[turn]}) if turn < len(plan) else ToolCall("answer", {"text": task.answer})

    def on_reset(self, task: Task) -> None:
        view = qa_docs(task)
        self.docs = view.docs
        self.gold = set(view.supporting)
        self.reads: list[dict[str, Any]] = []
        self._read_docs: set[int] = set()
        self._last_read: dict[str, Any] | None = None

    def user_message(self, task: Task) -> str:
        titles = "\n".join(f"[{i}] {d.title}" for i, d in enumerate(self.docs))
        return f"Question: {task.question}\n\nDocuments:\n{titles}"

    @tool
    def read(self, doc: int | str) -> str:
        """Read one document and add its text to the conversation.

        Args:
            doc: the document's number in the list (or its exact title)
        """
        index = self._resolve(doc)
        title = self.docs[index].title
        record = {"turn": self.turn, "doc": index, "title": title, "gold": title in self.gold,
                  "reread": index in self._read_docs, "answer": self.holds_answer(self.docs[index].text)}
        self.reads.append(record)
        self._read_docs.add(index)
        self._last_read = record
        return f"[{index}] {title}\n{self.docs[index].text}"

    def _resolve(self, doc: int | str) -> int:
        if isinstance(doc, int):
            if 0 <= doc < len(self.docs):
                return doc
            raise ToolError(f"no document [{doc}]: choose a number from 0 to {len(self.docs) - 1}")
        wanted = _bare(doc)
        if wanted.isdigit():
            return self._resolve(int(wanted))
        for i, d in enumerate(self.docs):
            if _bare(d.title) == wanted:  # both sides alike: `read Joseph Seamon Cotter Sr.` finds "...Sr."
                return i
        raise ToolError(f"no document titled {doc!r}: give its number from 0 to {len(self.docs) - 1}")

    def step_read(self) -> dict[str, Any] | None:
        read, self._last_read = self._last_read, None
        return read or None

    def verifier_context(self) -> dict[str, Any]:
        return {"evidence": [r["title"] for r in self.reads]}


def _bare(title: str) -> str:
    """A title as a read names it: case, surrounding brackets, quotes and a final period do not matter."""
    return " ".join(title.strip().strip("[]\"'.").split()).lower()
