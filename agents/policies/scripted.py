"""Scripted baselines. They act through the env's own tool-call format (so every harness is exercised
the same way) and return canonical token ids with logprob 0.

DocRead readers: they cannot read, so they answer with the title of a document they read (random
reader: a random one of its reads; first-k: the first). HotpotQA answers are often the title of a
paragraph (comparison questions above all), so this is the cheapest non-trivial guess; it makes these
baselines a floor for both reading (support recall) and answering. They read the task's documents through
`sleuth.tasks.qa.qa_docs`.

The oracle knows the gold and plays the oracle each env declares beside itself (`ToolEnv.oracle`), found found
by the env registry from the class the reset names (`envs.registry.oracle_of`): on DocRead it reads exactly the
supporting documents and answers the gold answer; on Search it searches for and opens each supporting document
by title; on SWE it replays the gold patch through the tools; on any other env it hands the task's reference
answer to the final tool (on a reasoning-gym env, the item's answer in its answer tags). Either way it must
score 1.0, which tests env, harness round-trip and verifier together.

`random-legal` plays a move the env lists as legal (the foreign text envs of `envs/families`)."""

from __future__ import annotations

import random
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sleuth.agents.policies.base import Generation, Request, SamplingParams
from sleuth.envs.outcome import ResetInfo
from sleuth.envs.parsers import ToolCall, get_parser
from sleuth.envs.registry import oracle_of
from sleuth.tasks.qa import Document, NoDocuments, QADocs, qa_docs


class ScriptedPolicy(ABC):
    name = "scripted"
    version = 0
    max_context: int | None = None
    parallel_calls: int = 1

    def __init__(self, tokenizer: Any, seed: int = 0):
        self.tokenizer = tokenizer
        self.seed = seed
        eos = tokenizer.eos_token_id
        self.eos = eos if isinstance(eos, int) else eos[0]

    @abstractmethod
    def act(self, req: Request) -> ToolCall | list[ToolCall]:
        """The tool call for this turn, or the calls of one reply (none: a reply without a call)."""

    def generate(self, requests: list[Request], sampling: SamplingParams) -> list[Generation]:
        out = []
        for req in requests:
            parser = get_parser(req.start.format if req.start is not None else "json")
            calls = self.act(req)
            text = "\n".join(map(parser.render, calls)) if isinstance(calls, list) else parser.render(calls)
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.eos]
            out.append(Generation(ids=ids, logprobs=[0.0] * len(ids), text=text, finish_reason="stop"))
        return out


class _Reader(ScriptedPolicy):
    """Reads the documents of `plan` in order (by number, or by title where `by_title`), then answers."""

    by_title: bool = False

    @abstractmethod
    def plan(self, req: Request, docs: QADocs) -> list[int]:
        """Which documents to read, in order."""

    def final_answer(self, req: Request, docs: QADocs, plan: list[int]) -> str:
        return docs.docs[plan[0]].title if plan else ""

    def act(self, req: Request) -> ToolCall:
        try:
            docs = qa_docs(req.task)
        except NoDocuments:
            raise NoDocuments(f"the {self.name} baseline reads documents: task {req.task.id} has none") from None
        plan = self.plan(req, docs)
        if req.turn < len(plan):
            doc = plan[req.turn]
            return ToolCall("read", {"doc": docs.docs[doc].title if self.by_title else doc})
        return ToolCall("answer", {"text": self.final_answer(req, docs, plan)})


class RandomReader(_Reader):
    """Reads `budget` distinct documents chosen at random (seeded per task), answers a random read title."""

    name = "random"

    def plan(self, req: Request, docs: QADocs) -> list[int]:
        rng = random.Random(f"{self.seed}:{req.task.id}")
        n = len(docs.docs)
        return rng.sample(range(n), min(n, _budget(req)))

    def final_answer(self, req: Request, docs: QADocs, plan: list[int]) -> str:
        rng = random.Random(f"{self.seed}:{req.task.id}:answer")
        return docs.docs[rng.choice(plan)].title if plan else ""


class FirstKReader(_Reader):
    """Reads the first k documents in list order (k = the read budget), answers the first title."""

    name = "first-k"

    def plan(self, req: Request, docs: QADocs) -> list[int]:
        return list(range(min(len(docs.docs), _budget(req))))



def _start(req: Request) -> ResetInfo:
    if req.start is None:
        raise ValueError("the oracle plays the env's own oracle: it needs the env's reset (Request.start)")
    return req.start


def _budget(req: Request) -> int:
    """The env's read budget (3 where it names none)."""
    return req.start.budget if req.start is not None and req.start.budget is not None else 3


class Oracle(ScriptedPolicy):
    """Plays the oracle the env declares beside itself (`ToolEnv.oracle`; DocRead reads the supporting
    documents, Search searches and opens them, SWE replays the gold patch, any other env hands the reference
    answer to its final tool)."""

    name = "oracle"

    def act(self, req: Request) -> ToolCall | list[ToolCall]:
        return oracle_of(_start(req))(req.task, req.turn, _start(req))


class TitleOracle(Oracle):
    """The oracle reading by title (`read Harvey Pekar`, which DocRead resolves like a number), the gold
    document whose title the question names first: the env's oracle on the task with its documents listed
    named-first, each read turned into the same read by title. As demonstrations, its read targets are spans
    a small model can copy from the question and the title list ("read what the question is about"); the
    plain oracle's numbers teach where gold documents happened to sit. On a task without documents it is
    the oracle."""

    name = "oracle-title"

    def act(self, req: Request) -> ToolCall | list[ToolCall]:
        view = qa_docs(req.task, missing_ok=True)
        question = req.task.question.lower()
        named_first = QADocs(tuple(sorted(view.docs, key=lambda d: d.title.lower() not in question)),  # stable
                             view.supporting)
        task = replace(req.task, payload={**req.task.payload, **named_first.to_payload()}) if view.docs else req.task
        call = oracle_of(_start(req))(task, req.turn, _start(req))
        # DocRead's read by number, as the same read by title
        if isinstance(call, ToolCall) and call.name == "read" and view.docs:
            return ToolCall("read", {"doc": named_first.docs[call.arguments["doc"]].title})
        return call


# Words too common to say what a title is about: the function words of English questions, written out (a
# library's stop list, e.g. NLTK's, would be a dependency for forty words).
_STOPWORDS = frozenset("a an and are as at be by did do does for from how in is it its of on or that the this "
                       "to was were what when where which who whom whose with".split())


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _STOPWORDS}


def lexical_plan(question: str, docs: Sequence[Document], k: int) -> list[int]:
    """`k` documents chosen one at a time by how a title matches what the reader can see: the question and
    the documents read so far. A title named whole in the question scores 100, named whole in a read
    document 50, plus 10 × the share of its words in the question and 5 × the share in the read text; ties
    go to the earlier document. No gold labels: on HotpotQA's distractor setting it finds 0.83 (dev) and 0.81
    (test) of the supporting documents in 3 reads, the first hop by the question's entity and the second by
    the bridge entity the first document names."""
    question_l, q_words = question.lower(), _words(question)
    seen_text, seen_words = "", set()
    plan: list[int] = []
    for _ in range(min(k, len(docs))):
        best, best_score = None, -1.0
        for i, doc in enumerate(docs):
            if i in plan or any(docs[j].title == doc.title for j in plan):
                continue
            named = re.compile(rf"(?<!\w){re.escape(doc.title.lower())}(?!\w)")  # whole words only
            words = _words(doc.title)
            score = 100.0 * bool(named.search(question_l)) + 50.0 * bool(named.search(seen_text))
            if words:
                score += 10.0 * len(words & q_words) / len(words) + 5.0 * len(words & seen_words) / len(words)
            if score > best_score:
                best, best_score = i, score
        if best is None:
            break
        plan.append(best)
        seen_text += " " + docs[best].text.lower()
        seen_words |= _words(docs[best].text)
    return plan


class LexicalReader(_Reader):
    """Reads `budget` documents by title match with the question and the text read so far (`lexical_plan`),
    by title; answers the title of its first read. The floor any learned reader should clear: what copying
    names from the question and the documents achieves, with no model at all."""

    name = "lexical"
    by_title = True

    def plan(self, req: Request, docs: QADocs) -> list[int]:
        return lexical_plan(req.task.question, docs.docs, _budget(req))


class LexicalOracle(LexicalReader):
    """Reads as `lexical` does, then answers the gold answer. As demonstrations, every read follows one rule
    a small model can execute from what it sees (copy the title the question or the last document names);
    the gold oracle's second read is a title the context names in only ~45% of HotpotQA train questions."""

    name = "oracle-lexical"

    def final_answer(self, req: Request, docs: QADocs, plan: list[int]) -> str:
        return req.task.answer


class RandomLegal(ScriptedPolicy):
    """A move the env lists as legal now (`Request.legal_actions`: GEM's own random actions, the moves a
    TextArena game lists), uniformly at random, seeded by the task and the turn: the floor of a game any learned
    player should clear. Where the env lists none it replies with nothing, which the env scores by its own rules
    (GEM: a format error)."""

    name = "random-legal"

    def act(self, req: Request) -> ToolCall:
        rng = random.Random(f"{self.seed}:{req.task.id}:{req.turn}")
        return ToolCall("move", {"text": rng.choice(req.legal_actions) if req.legal_actions else ""})


class Noop(ScriptedPolicy):
    """Ends the episode at once through the env's first final tool with no arguments (SWE: submits no
    change). A floor: it must score 0 wherever doing nothing is wrong."""

    name = "noop"

    def act(self, req: Request) -> ToolCall:
        for name in ("submit", "answer"):
            if any(t["function"]["name"] == name for t in (req.start.tools if req.start is not None else [])):
                return ToolCall(name, {"text": ""} if name == "answer" else {})
        raise ValueError("the noop baseline needs a submit or answer tool")
