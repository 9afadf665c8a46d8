"""An agent whose tools are unlike those of the tool-calling warm start's demonstrations: `list_paragraphs` (no
arguments) numbers the task's paragraphs, `open_paragraph(number)` shows one by its integer number, and the
answer is the model's final text. Written against the `openai` SDK alone."""

import json

from openai import OpenAI

SYSTEM = ("You are a careful reader. First list the paragraphs, then open the ones that can answer the question, "
          "then write the answer as a short phrase.")
TOOLS = [
    {"type": "function", "function": {
        "name": "list_paragraphs", "description": "Number and title of every paragraph you can open.",
        "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {
        "name": "open_paragraph", "description": "The text of the paragraph with this number.",
        "parameters": {"type": "object", "properties": {"number": {"type": "integer"}}, "required": ["number"]}}},
]
MAX_CALLS = 6


def call_tool(docs: list[dict], name: str, arguments: str) -> str:
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError:
        return "the arguments are not JSON"
    if name == "list_paragraphs":
        return "\n".join(f"{i}: {d['title']}" for i, d in enumerate(docs))
    if name == "open_paragraph":
        try:
            return docs[int(args.get("number"))]["text"]
        except (TypeError, ValueError, IndexError):
            return f"there is no paragraph {args.get('number')!r}: list them first"
    return f"there is no tool {name!r}"


def run(task: dict, base_url: str) -> str:
    client = OpenAI(base_url=base_url, api_key="not-needed")
    docs = task["payload"]["docs"]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["question"]}]
    text = ""
    for _ in range(MAX_CALLS):
        message = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        text = message.content or ""
        if not message.tool_calls:
            return text
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": call_tool(docs, call.function.name, call.function.arguments)})
    return text
