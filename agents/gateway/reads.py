"""The reads of an agent whose tools sleuth does not run: a document of the task (`payload["docs"]`) counts as
read on the turn whose tool results, as the agent sent them back, hold its text. This is what gives an agent
episode the read events a DocRead episode has — support recall of what the agent read, and the step rewards
that price reads (`info_gain`) — without any change to the agent or its tools.

The test is the document's text, not its title: a search result listing titles shows no document, and a tool
that returns a document's text shows it whatever the tool is called. A tool that returns only part of a document
(its first `PREFIX_CHARS` characters must be there) or rewrites it is not seen reading; a result that shows
several documents records the first new one (a turn has one read)."""

from __future__ import annotations

from collections.abc import Sequence

from sleuth.agents.trajectory import ReadEvent, Trajectory
from sleuth.tasks.base import Task
from sleuth.tasks.qa import qa_docs
from sleuth.verifiers.qa import answer_in_text, gold_answers

PREFIX_CHARS = 200  # how much of a document's text a tool result must hold, verbatim, to count as reading it


def recognise_reads(segments: Sequence[Trajectory], task: Task) -> list[ReadEvent] | None:
    """Set `Turn.read` on the turns of an episode's segments (in order) whose tool results show a document;
    the reads, or None for a task without documents (nothing to recognise)."""
    docs = qa_docs(task, missing_ok=True)
    if not docs.docs:
        return None
    gold = set(docs.supporting)
    answers = gold_answers(task) if task.answer else []
    keys = [" ".join(d.text.split())[:PREFIX_CHARS] for d in docs.docs]
    seen: set[int] = set()
    reads = []
    for segment in segments:
        for t, turn in enumerate(segment.turns):
            if turn.read is not None or not turn.observation:
                continue
            shown = " ".join(turn.observation.split())
            found = [i for i, key in enumerate(keys) if key and key in shown]
            if not found:
                continue
            i = next((i for i in found if i not in seen), found[0])
            doc = docs.docs[i]
            turn.read = ReadEvent(i, doc.title, gold=doc.title in gold if gold else None, reread=i in seen, turn=t,
                                  answer=answer_in_text(doc.text, answers) if answers else None)
            seen.add(i)
            reads.append(turn.read)
    return reads
