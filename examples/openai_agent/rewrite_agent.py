"""The same tools as `append_agent`, with a short memory: each research call sends the system prompt, the
question and notes of what the tools returned so far, never the earlier turns (the history is rewritten every
call), and a last call with a prompt of its own writes the answer from the notes. The gateway records each
rewritten history as a segment of its own."""

from append_agent import SYSTEM, TOOLS, call_tool
from openai import OpenAI

MAX_CALLS = 4
FINAL = "Reply with only the answer to the question, in a few words, using the notes."


def run(task: dict, base_url: str) -> str:
    client = OpenAI(base_url=base_url, api_key="not-needed")
    docs = task["payload"]["docs"]
    notes: list[str] = []
    for _ in range(MAX_CALLS):
        question = f"{task['question']}\n\nNotes so far:\n" + ("\n".join(notes) or "none")
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        calls = reply.choices[0].message.tool_calls
        if not calls:
            break
        for call in calls:
            result = call_tool(docs, call.function.name, call.function.arguments)
            notes.append(f"{call.function.name}({call.function.arguments}): {result[:500]}")
        notes = notes[-3:]  # the newest three results: older ones are dropped
    messages = [{"role": "system", "content": FINAL},
                {"role": "user", "content": f"Question: {task['question']}\n\nNotes:\n" + "\n".join(notes)}]
    reply = client.chat.completions.create(model="policy", messages=messages)
    return reply.choices[0].message.content or ""
