"""Chat records (OpenAI messages, optionally with `tools` and assistant `tool_calls`) as the trajectories the
gateway would record had the policy written their assistant messages: each assistant message is one call of the
record's conversation so far, answered with that message's text as the model writes it (`ChatFormat.assistant_text`:
the template's tool-call format, or the JSON harness format where the template renders no tools).

Replaying through the gateway itself, not a second renderer, is what makes a demonstration look to the model
exactly as a live agent's call will: the same system-message tool instructions, the same ids for tool results, the
same segments where a record's history is rewritten."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sleuth.agents.gateway.recorder import Gateway
from sleuth.agents.gateway.render import MessageError, normalise
from sleuth.agents.policies.base import Generation, Request, SamplingParams
from sleuth.agents.trajectory import Trajectory
from sleuth.tasks.base import Task


class _Demonstrator:
    """The policy the replay runs: it writes the text it is handed for the next call, as the canonical ids of
    that text followed by the end-of-turn token (what a model that learned the text samples)."""

    name, version, max_context, parallel_calls = "demonstration", 0, None, 2

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        eos = tokenizer.eos_token_id
        self.eos = eos if isinstance(eos, int) else eos[0]
        self.text = ""

    def generate(self, requests: list[Request], sampling: SamplingParams) -> list[Generation]:
        ids = self.tokenizer.encode(self.text, add_special_tokens=False) + [self.eos]
        return [Generation(ids, [0.0] * len(ids), self.text) for _ in requests]


class ChatReplay:
    """Replays chat records through a gateway over `tokenizer`, one record at a time."""

    def __init__(self, tokenizer: Any):
        self.policy = _Demonstrator(tokenizer)
        self.gateway = Gateway(self.policy, SamplingParams(max_tokens=1 << 20))

    def trajectories(self, record_id: str, messages: Sequence[dict[str, Any]],
                     tools: list[dict[str, Any]] | None = None) -> list[Trajectory]:
        """The record's segments (one unless its history is rewritten); every assistant message trains.
        Raises `ValueError` naming the record when it has no assistant message after a prompt, or when an
        assistant message's tool calls do not read back as the same calls (a tool the record does not offer,
        arguments that are not an object)."""
        if not messages or messages[0].get("role") == "assistant" or not any(
                m.get("role") == "assistant" for m in messages):
            raise ValueError(f"chat record {record_id}: needs a prompt message followed by at least one "
                             f"assistant message")
        self.gateway.begin(record_id, Task(id=record_id, question=""))
        try:
            sent: list[dict[str, Any]] = []
            call_ids: dict[str, str] = {}  # the record's tool-call ids -> the ids the gateway gave those calls
            for i, message in enumerate(messages):
                if message.get("role") != "assistant":
                    if message.get("role") == "tool" and message.get("tool_call_id") in call_ids:
                        message = {**message, "tool_call_id": call_ids[message["tool_call_id"]]}
                    sent.append(dict(message))
                    continue
                want = normalise(message)
                self.policy.text = self.gateway.format.assistant_text(want)
                got = self.gateway.complete(record_id, sent, tools).choices[0].message
                if _calls(normalise(got)) != _calls(want):
                    raise ValueError(f"chat record {record_id}: message {i}'s tool calls read back as "
                                     f"{_calls(normalise(got))}, not {_calls(want)} (does `tools` offer them?)")
                for (old, *_), new in zip(want.get("tool_calls", []), got.get("tool_calls") or [], strict=True):
                    call_ids[old] = new["id"]
                sent.append(got)
        except MessageError as e:
            self.gateway.end(record_id)
            raise ValueError(f"chat record {record_id}: {e}") from None
        segments = self.gateway.end(record_id).segments
        for t in segments:
            t.env_id, t.meta = "chat", {}
        return segments

    def close(self) -> None:
        self.gateway.close()


def _calls(message: dict[str, Any]) -> list[tuple[str, str]]:
    return [(name, json.dumps(args, sort_keys=True)) for _, name, args in message.get("tool_calls", [])]
