"""Search (`sleuth/Search-v0`): open-domain multi-hop QA over a corpus. Tools: `search(query, k)` →
ranked titles with snippets, `open(doc_id)` → the full passage, `answer(text)`. The retriever is in
process (an index object or an index directory) or a retrieval server URL. `info` records each query,
the retrieved ids, and whether gold paragraphs were retrieved and opened."""

from __future__ import annotations

import warnings
from functools import lru_cache
from typing import Any

from sleuth.envs.outcome import ResetInfo
from sleuth.envs.parsers import ToolCall
from sleuth.envs.qa import QAEnv
from sleuth.envs.retrieval.base import Retriever
from sleuth.envs.tools import ToolError, tool
from sleuth.tasks.base import Task
from sleuth.tasks.qa import qa_docs

CORPORA = ("hotpotqa", "musique", "2wiki")


@lru_cache(maxsize=4)
def default_retriever(corpus: str = "hotpotqa") -> Retriever:
    """A BM25 index over the named corpora (comma-separated), built once per process: every paragraph of
    the HotpotQA files (train, dev, test), of MuSiQue, and/or the 2WikiMultihopQA passages."""
    from sleuth.envs.retrieval.bm25 import BM25Index
    from sleuth.envs.retrieval.corpus import Doc, corpus_from_tasks, load_corpus
    from sleuth.tasks.registry import data_dir, load_tasks

    docs: dict[str, Doc] = {}
    for name in corpus.split(","):
        if name == "hotpotqa":
            found = corpus_from_tasks(t for split in ("train", "dev", "test") for t in load_tasks(f"hotpotqa:{split}"))
        elif name == "musique":
            found = corpus_from_tasks(load_tasks("musique:dev"))
        elif name == "2wiki":
            found = [Doc(d.title, d.title, d.text) for d in
                     load_corpus(data_dir() / "corpora" / "2wikimultihopqa_passages.jsonl", id_field="title")]
        else:
            raise ValueError(f"unknown corpus {name!r}; known: {', '.join(CORPORA)}")
        for d in found:
            docs.setdefault(d.id, d)
    return BM25Index(list(docs.values()))


def _retriever(spec: Retriever | str | None, corpus: str) -> Retriever:
    if spec is None:
        return default_retriever(corpus)
    if isinstance(spec, str) and spec.startswith(("http://", "https://")):
        from sleuth.envs.retrieval.client import RetrievalClient

        return RetrievalClient(spec)
    if isinstance(spec, str):
        from sleuth.envs.retrieval.index import load_index

        return load_index(spec)
    return spec


class SearchEnv(QAEnv):
    instructions = (
        "Answer the question. Search the collection for evidence, open the documents you need, then answer "
        "with a short phrase only: a name, a date, a number, or yes/no."
    )
    budget_unit = "tool calls"
    default_budget = 6

    def __init__(self, *, retriever: Retriever | str | None = None, corpus: str = "hotpotqa", k: int = 5,
                 snippet_chars: int = 160, **kwargs: Any):
        self.retriever = _retriever(retriever, corpus)
        self.tasks_without_gold_in_index = 0
        self.default_k, self.snippet_chars = k, snippet_chars
        super().__init__(**kwargs)

    @classmethod
    def oracle(cls, task: Task, turn: int, start: ResetInfo) -> ToolCall:
        """Search for each supporting title and open it (open only, if the budget is short), then answer the
        gold answer. The shipped corpora use titles as ids, so a supporting title is the id to open."""
        gold = qa_docs(task, missing_ok=True).supporting
        per_doc = 2 if 2 * len(gold) <= (start.budget or 0) else 1
        if turn >= per_doc * len(gold):
            return ToolCall("answer", {"text": task.answer})
        title = gold[turn // per_doc]
        if per_doc == 2 and turn % 2 == 0:
            return ToolCall("search", {"query": title})
        return ToolCall("open", {"doc_id": title})

    def on_reset(self, task: Task) -> None:
        self.gold = set(qa_docs(task, missing_ok=True).supporting)
        if self.gold and not self._gold_in_index():
            self.tasks_without_gold_in_index += 1
            if self.tasks_without_gold_in_index == 1:  # once per env: an eval would repeat it per task
                warnings.warn(f"Search-v0: none of task {task.id!r}'s supporting documents "
                              f"({', '.join(sorted(self.gold))}) is in the index: is it an index of this corpus? "
                              "Scores then measure the policy's memory, not its search.", stacklevel=2)
        self.queries: list[dict[str, Any]] = []
        self.opened: list[dict[str, Any]] = []
        self._event: dict[str, Any] | None = None

    @tool
    def search(self, query: str, k: int = 5) -> str:
        """Search the collection; returns ranked document ids with the start of each text.

        Args:
            query: what to look for
            k: how many results (1-20)
        """
        if not query.strip():
            raise ToolError("search needs a non-empty query")
        k = max(1, min(int(k), 20))
        hits = self.retriever.search([query], k)[0]
        ids = [h.id for h in hits]
        gold = sorted({h.id for h in hits if self._is_gold(h.id)})
        event = {"turn": self.turn, "query": query, "retrieved": ids, "gold_retrieved": gold}
        self.queries.append(event)
        self._event = {"search": event}
        if not hits:
            return "no results"
        lines = []
        for rank, h in enumerate(hits, start=1):
            doc = self.retriever.get(h.id)
            text = doc.text if doc else ""
            snippet = text[: self.snippet_chars] + ("..." if len(text) > self.snippet_chars else "")
            lines.append(f"{rank}. [{h.id}] {snippet}" if doc and doc.title == h.id
                         else f"{rank}. [{h.id}] {doc.title if doc else ''}: {snippet}")
        return "\n".join(lines)

    @tool
    def open(self, doc_id: str) -> str:
        """Open a document by its id (shown in brackets in search results) and read all of it.

        Args:
            doc_id: the document id
        """
        key = doc_id.strip().strip("[]\"'")
        doc = self.retriever.get(key)
        if doc is None:
            raise ToolError(f"no document with id {doc_id!r}: use an id from the search results")
        event = {"turn": self.turn, "doc": key, "title": doc.title, "gold": doc.title in self.gold,
                 "reopen": any(o["doc"] == key for o in self.opened)}
        self.opened.append(event)
        # also a read event (`Turn.read`), as DocRead's `read` reports: what the step-reward estimators
        # (info_gain, cw_grpo's rule judge) score
        read = {"turn": self.turn, "doc": key, "title": doc.title, "gold": event["gold"], "reread": event["reopen"],
                "answer": self.holds_answer(doc.text)}
        self._event = {"open": event, "read": read}
        return f"[{doc.id}] {doc.title}\n{doc.text}"

    def _gold_in_index(self) -> bool:
        """Whether any supporting document is in the index: by id (titles are the ids of the shipped
        corpora), else among the top hits of a search for its title."""
        for title in self.gold:
            if self.retriever.get(title) is not None:
                return True
            for hit in self.retriever.search([title], 3)[0]:
                doc = self.retriever.get(hit.id)
                if doc is not None and doc.title in self.gold:
                    return True
        return False

    def _is_gold(self, doc_id: str) -> bool:
        """Gold is decided by title (the data sets name supporting paragraphs by title)."""
        doc = self.retriever.get(doc_id)
        return doc is not None and doc.title in self.gold

    def step_read(self) -> dict[str, Any] | None:
        return (self._event or {}).get("read")

    def step_info(self) -> dict[str, Any]:
        event, self._event = self._event, None
        return {k: v for k, v in (event or {}).items() if k != "read"}

    def verifier_context(self) -> dict[str, Any]:
        return {"evidence": [o["title"] for o in self.opened]}
