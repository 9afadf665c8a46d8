"""A test agent written against the openai SDK alone: it asks the model twice, keeping only the question the
second time (a rewritten history: two segments), and answers, by the parity of the model's second reply,
either with every document title (which scores some F1 on most HotpotQA questions) or with none of them —
so a group's rewards differ and GRPO has signal."""

from openai import OpenAI


def run(task: dict, base_url: str) -> str:
    client = OpenAI(base_url=base_url, api_key="x")
    question = task["question"]
    first = client.chat.completions.create(model="p", messages=[{"role": "user", "content": question}])
    notes = first.choices[0].message.content or ""
    second = client.chat.completions.create(model="p", messages=[
        {"role": "system", "content": f"Notes: {notes[:200]}"}, {"role": "user", "content": question}])
    titles = " ".join(d["title"] for d in task["payload"]["docs"])
    return titles if sum(map(ord, second.choices[0].message.content or "")) % 2 else "no idea"
