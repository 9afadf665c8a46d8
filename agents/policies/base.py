"""The policy interface (token ids in, token ids + sampling logprobs out, batched across episodes) and the
data it passes. Policies by name are loaded by `sleuth.agents.policies.load.load_policy`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sleuth.envs.outcome import ResetInfo
from sleuth.tasks.base import Task


@dataclass
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None


@dataclass
class Request:
    """One episode's next turn: the exact context ids, plus the same context as chat messages for
    backends that speak messages (HTTP chat APIs) and for scripted baselines."""

    prompt_ids: list[int]
    messages: list[dict[str, Any]]
    task: Task
    turn: int = 0
    start: ResetInfo | None = None  # the env's reset (tools, format, budget); None: a caller without an env
    sample: int | None = None  # the episode's index in its run: a server seeds (sample, turn), whatever the batching
    legal_actions: Sequence[str] | None = None  # the moves a text env says it accepts now (None: it does not say)


@dataclass
class Generation:
    ids: list[int]  # the sampled ids, ending with the end-of-turn token unless cut off
    logprobs: list[float]  # logprob of each sampled id under the model (raw logits, temperature 1)
    text: str  # decoded action text, special tokens skipped
    finish_reason: str = "stop"  # "stop" or "length"


class Policy(Protocol):
    name: str
    version: int  # bumped whenever weights change, recorded on every turn
    tokenizer: Any
    max_context: int | None  # the longest context (prompt + generation) it can take; None: no limit known
    # How many `generate` calls may run at once: 1 for a model in this process (requests wait and go as one
    # batch), the connection count for a server (each request its own call, batched by the server).
    parallel_calls: int

    def generate(self, requests: list[Request], sampling: SamplingParams) -> list[Generation]: ...
