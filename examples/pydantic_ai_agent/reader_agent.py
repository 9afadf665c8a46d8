"""A HotpotQA reader written with pydantic-ai alone, as its docs show: an `Agent` with two tools over the task's
documents (`task["payload"]["docs"]`, given to the tools as the run's dependencies), run by pydantic-ai's own
loop against any OpenAI-compatible chat-completions endpoint. The model's final text is the answer."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic_ai import Agent, RunContext
from pydantic_ai.exceptions import UnexpectedModelBehavior, UsageLimitExceeded
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.usage import UsageLimits

MAX_CALLS = 6  # model requests per question


@dataclass
class Docs:
    """What the tools read: the task's own documents, each {"title", "text"}."""

    docs: list[dict]


# No model here: each run names its endpoint. No telemetry: pydantic-ai sends OpenTelemetry spans only when asked
# (Agent.instrument_all() or the Instrumentation capability), and nothing else but the model's endpoint.
reader = Agent(
    deps_type=Docs,
    instructions=("Answer the question from the documents. Use search to find document titles and read to see a "
                  "document. When you know the answer, reply with: Answer: <a few words>"),
    retries=2,
    name="reader",
)


def words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


@reader.tool
def search(ctx: RunContext[Docs], query: str) -> str:
    """The titles of the three documents that best match a query."""
    q = words(query)
    ranked = sorted(ctx.deps.docs, key=lambda d: -len(q & words(d["title"] + " " + d["text"])))
    return "\n".join(d["title"] for d in ranked[:3])


@reader.tool
def read(ctx: RunContext[Docs], title: str) -> str:
    """The text of the document with this title."""
    found = [d["text"] for d in ctx.deps.docs if d["title"].lower() == title.strip().lower()]
    return found[0] if found else f"no document is titled {title!r}: search for it first"


async def run(task: dict, base_url: str) -> str:
    """The answer to one task, asking the model at `base_url`; no answer ("") when the model runs out of calls
    or keeps calling tools wrongly (the agent's own limits, not a crash)."""
    model = OpenAIChatModel("policy", provider=OpenAIProvider(base_url=base_url, api_key="not-needed"))
    async with model:  # closes the HTTP client this run's provider opened
        try:
            result = await reader.run(task["question"], model=model, deps=Docs(task["payload"]["docs"]),
                                      usage_limits=UsageLimits(request_limit=MAX_CALLS))
        except (UsageLimitExceeded, UnexpectedModelBehavior):
            return ""
    return result.output
