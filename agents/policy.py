"""The policy interface (token ids in, token ids + sampling logprobs out, batched across episodes) and
`load_policy("smollm2" | "random" | "first-k" | "lexical" | "oracle" | "oracle-title" | "oracle-lexical" | "noop" |
<local path> | <hub id>)`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from sleuth.registry import Registry
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
    env_info: dict[str, Any] = field(default_factory=dict)  # the info from reset (tools, format, budget)
    sample: int | None = None  # the episode's index in its run: a server seeds (sample, turn), whatever the batching


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


def _scripted(cls_name: str) -> Any:
    def build(tokenizer: Any, seed: int) -> Policy:
        from sleuth.agents import scripted

        return getattr(scripted, cls_name)(tokenizer, seed=seed)
    return build


# The scripted baselines by name: a factory `(tokenizer, seed) -> Policy` each.
SCRIPTED_POLICIES: Registry[Any] = Registry("scripted policy")
for _name, _cls in {"random": "RandomReader", "first-k": "FirstKReader", "oracle": "Oracle",
                    "oracle-title": "TitleOracle", "lexical": "LexicalReader",
                    "oracle-lexical": "LexicalOracle", "noop": "Noop"}.items():
    SCRIPTED_POLICIES.register(_name, _scripted(_cls), "sleuth")
SCRIPTED = tuple(SCRIPTED_POLICIES.names())


def load_tokenizer(model: str = "smollm2") -> Any:
    from transformers import AutoTokenizer

    from sleuth.agents.models import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(model))


def load_policy(spec: str, tokenizer_model: str = "smollm2", seed: int = 0, **kwargs: Any) -> Policy:
    """Scripted baselines render with `tokenizer_model`'s tokenizer; anything else loads a transformers model."""
    if spec in SCRIPTED_POLICIES:
        return SCRIPTED_POLICIES.get(spec)(load_tokenizer(tokenizer_model), seed)
    from sleuth.agents.hf import TransformersPolicy
    from sleuth.agents.models import EMBEDDED, ModelNotFoundError, NotAModelDirectory, resolve_model

    try:
        resolve_model(spec)
    except NotAModelDirectory:
        raise  # a path that exists: what it lacks is the message, not a list of policy names
    except ModelNotFoundError:
        import difflib

        names = [EMBEDDED, *SCRIPTED_POLICIES.names()]
        close = difflib.get_close_matches(spec, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ModelNotFoundError(f"unknown policy {spec!r}{hint}: not one of {', '.join(names)}, not an existing path, "
                                 "not a model in the local Hugging Face cache (nothing is downloaded here)") from None

    return TransformersPolicy(spec, **kwargs)
