"""bench/gateway.py's agent for arm B, written against the `openai` SDK alone, and the DocRead-like
tools it runs over the task's documents (shared with the overhead section's conversations)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sleuth.envs.parsers import NO_CALL

INSTANT_MAX_TOKENS = 16

# -- arm B's agent: written against the openai SDK alone -------------------------------------------------------
# DocRead-v0's instructions and tool schemas, verbatim (checked against the env when the bench starts), so
# the gateway renders the same system prompt the env's json harness does.
INSTRUCTIONS = ("Answer the question. You see the titles of some documents; read the ones you need (each read "
                "shows you one document), then answer with a short phrase only: a name, a date, a number, or yes/no.")
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "read", "description": "Read one document and add its text to the conversation.",
        "parameters": {"type": "object", "properties": {"doc": {
            "type": ["integer", "string"], "description": "the document's number in the list (or its exact title)"}},
            "required": ["doc"]}}},
    {"type": "function", "function": {
        "name": "answer", "description": "Give the final answer (a short phrase) and end the episode.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string", "description": "the answer"}},
                       "required": ["text"]}}},
]
MAX_OBSERVATION = 4000


def _bare(title: str) -> str:
    return " ".join(title.strip().strip("[]\"'.").split()).lower()


def _clip(text: str) -> str:
    if len(text) <= MAX_OBSERVATION:
        return text
    return text[:MAX_OBSERVATION] + f"\n[... truncated {len(text) - MAX_OBSERVATION} characters]"


def run_tool(docs: list[dict[str, Any]], name: str, arguments: str) -> tuple[str, bool]:
    """(the tool's text, whether it ends the episode), with DocRead's semantics and error texts."""
    try:
        args = json.loads(arguments)
    except ValueError:
        return f"the arguments of {name!r} are not valid JSON", False
    if not isinstance(args, dict):
        return f"the arguments of {name!r} must be an object", False
    if name == "answer":
        text = args.get("text")
        if not isinstance(text, str):
            return "missing argument(s) ['text'] for tool 'answer'; it takes ['text']", False
        return text.strip(), True
    if name != "read":
        return f"unknown tool {name!r}; available tools: read, answer", False
    doc = args.get("doc")
    last = len(docs) - 1
    if isinstance(doc, str) and _bare(doc).isdigit():
        doc = int(_bare(doc))
    if isinstance(doc, int) and not isinstance(doc, bool):
        if not 0 <= doc <= last:
            return f"no document [{doc}]: choose a number from 0 to {last}", False
        return f"[{doc}] {docs[doc]['title']}\n{docs[doc]['text']}", False
    if isinstance(doc, str):
        for i, d in enumerate(docs):
            if _bare(d["title"]) == _bare(doc):
                return f"[{i}] {d['title']}\n{d['text']}", False
        return f"no document titled {doc!r}: give its number from 0 to {last}", False
    return "missing argument(s) ['doc'] for tool 'read'; it takes ['doc']", False


@dataclass(frozen=True)
class DocReadAgent:
    """DocRead as an `openai`-SDK agent: the documents' titles in the first user message, `read(doc)` shows one,
    `answer(text)` ends the episode. `budget` non-final turns (tool calls and replies without one alike), then
    one last turn to answer, else no answer: DocRead-v0's budget. A reply without a tool call gets the env's
    error text back as a user message (the API has no tool message without a call to answer)."""

    budget: int
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None

    def __call__(self, task: dict[str, Any], base_url: str) -> str:
        from openai import OpenAI

        client = OpenAI(base_url=base_url, api_key="sleuth", max_retries=0, timeout=3600)
        docs = task["payload"]["docs"]
        titles = "\n".join(f"[{i}] {d['title']}" for i, d in enumerate(docs))
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": f"Question: {task['question']}\n\nDocuments:\n{titles}"}]
        seed = {"seed": self.seed} if self.seed is not None else {}
        left = self.budget
        while True:
            reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS,
                                                   max_tokens=self.max_tokens, temperature=self.temperature, **seed)
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            calls = message.tool_calls or []
            text, final = run_tool(docs, calls[0].function.name, calls[0].function.arguments) if calls else (
                NO_CALL, False)
            if final:
                return text
            left -= 1
            if left < 0:
                return ""  # out of budget: no answer, as the env truncates
            note = f"({left} reads left)" if left > 0 else "(no reads left: call answer now)"
            if not calls:
                messages.append({"role": "user", "content": _clip(f"{text}\n{note}")})
            for k, call in enumerate(calls):
                content = _clip(f"{text}\n{note}") if k == 0 else "(only one tool call per turn: ignored)"
                messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
