"""Demonstrations of an agent using OpenAI tools over a QA task's documents, as chat records (`messages` and
`tools`, TRL's tool-calling layout) for a warm start that speaks tool calls through the gateway.

Each task gets one conversation of a scripted reader: search with the question, read the supporting documents the
search showed (the first result where it showed none), answer with the gold answer. What varies from task to task
(drawn with the task's own seed) is everything an agent author chooses: the tool names, their parameter names and
descriptions, the system prompt, whether there is a search tool or the titles are listed in the question, how
results are written, and how the answer is given (an `Answer:` line, the bare answer, or an answer tool). A model
fine-tuned on one fixed tool set learns those names; drawn from many, it learns to read the tool list it is
given, which is what an agent it has never seen needs."""

from __future__ import annotations

import json
import random
import re
import zlib
from typing import Any

from sleuth.tasks.base import Task
from sleuth.tasks.qa import qa_docs

# (name, parameter, description)
SEARCH_TOOLS = [
    ("search", "query", "The titles of the three documents that best match a query."),
    ("search_documents", "query", "Search the documents; returns the best-matching titles."),
    ("find", "keywords", "Find documents about the keywords and list their titles."),
    ("lookup", "q", "Look up which documents match q."),
    ("web_search", "query", "Search the collection and return matching page titles."),
    ("retrieve", "text", "Retrieve the titles of the documents most similar to the text."),
]
READ_TOOLS = [
    ("read", "title", "The text of the document with this title."),
    ("open_document", "title", "Open a document by its title and return its text."),
    ("get_document", "name", "Return the full text of the named document."),
    ("read_page", "page", "Read the page with this title."),
    ("fetch", "title", "Fetch the content of a document given its exact title."),
    ("view", "doc_title", "Show the text of one document."),
]
ANSWER_TOOLS = [
    ("final_answer", "answer", "Give your final answer to the question."),
    ("submit", "answer", "Submit the answer; this ends the task."),
    ("answer", "text", "Answer the question in a few words."),
]
SYSTEMS = [
    "Answer the question from the documents. Use {search} to find document titles and {read} to see a document.",
    "You are a research assistant. Look things up with the tools before answering.",
    "Use the tools to find the facts you need, then answer the user's question.",
    "You answer questions about a small collection of documents. Call {read} on the documents that matter.",
    "Find the answer in the documents. Search first, read what looks relevant, then answer.",
    "",
]
ANSWER_STYLES = {
    "line": "When you know the answer, reply with: Answer: <a few words>",
    "bare": "Reply with only the answer, in a few words.",
    "tool": "When you know the answer, call {answer}.",
}


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


def _tool(name: str, param: str, description: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {param: {"type": "string"}}, "required": [param]}}}


def _exchange(n: int, name: str, param: str, value: str, result: str | None) -> list[dict[str, Any]]:
    """The `n`-th call of a conversation and, unless it ends it (`result` None), the tool's result."""
    call = {"role": "assistant", "content": None, "tool_calls": [{
        "id": f"call_{n}", "type": "function",
        "function": {"name": name, "arguments": json.dumps({param: value}, ensure_ascii=False)}}]}
    return [call] if result is None else [call, {"role": "tool", "tool_call_id": f"call_{n}", "content": result}]


def tool_demo(task: Task, seed: int = 0) -> dict[str, Any]:
    """One chat record (`id`, `messages`, `tools`) demonstrating `task` with the gold answer."""
    rng = random.Random(zlib.crc32(f"{seed}:{task.id}".encode()))
    docs = qa_docs(task)
    by_title = {d.title: d.text for d in docs.docs}
    search = rng.choice(SEARCH_TOOLS) if rng.random() < 0.8 else None
    read = rng.choice(READ_TOOLS)
    style = rng.choice(list(ANSWER_STYLES))
    answer_tool = rng.choice(ANSWER_TOOLS) if style == "tool" else None
    tools = [_tool(*t) for t in (search, read, answer_tool) if t is not None]
    names = {"search": (search or read)[0], "read": read[0], "answer": (answer_tool or read)[0]}
    system, instruction = rng.choice(SYSTEMS).format(**names), ANSWER_STYLES[style].format(**names)
    question = task.question if system else f"{task.question}\n\n{instruction}"  # no system prompt: all asked here
    system = f"{system} {instruction}" if system else ""
    if search is None:  # the titles come with the question
        titles = [d.title for d in docs.docs]
        question = f"{question}\n\nDocuments: " + "; ".join(titles)
        shown = titles
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": question})
    if search is not None:
        query = task.question if rng.random() < 0.7 else " ".join(w for w in re.findall(r"\w+", task.question)
                                                                  if len(w) > 3)
        ranked = sorted(docs.docs, key=lambda d: -len(_words(query) & _words(d.title + " " + d.text)))
        shown = [d.title for d in ranked[:rng.choice((3, 3, 4, 5))]]
        numbered = rng.random() < 0.3
        result = "\n".join(f"{i + 1}. {t}" if numbered else t for i, t in enumerate(shown))
        messages += _exchange(len(messages), search[0], search[1], query, result)
    for title in [t for t in shown if t in docs.supporting] or shown[:1]:
        text = by_title[title]
        messages += _exchange(len(messages), read[0], read[1], title,
                              f"# {title}\n{text}" if rng.random() < 0.3 else text)
    if answer_tool is not None:
        messages += _exchange(len(messages), answer_tool[0], answer_tool[1], task.answer, None)
    else:
        messages.append({"role": "assistant", "content": f"Answer: {task.answer}" if style == "line"
                         else task.answer})
    return {"id": f"tool-demo-{task.id}", "messages": messages, "tools": tools}
