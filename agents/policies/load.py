"""Policies by name: `load_policy("smollm2" | "random" | "first-k" | "lexical" | "oracle" | "oracle-title" |
"oracle-lexical" | "noop" | "random-legal" | <local path> | <hub id>)`. The factory lives apart from the `Policy`
protocol (`agents/policies/base.py`) so that it can import the implementations, which import the protocol."""

from __future__ import annotations

from typing import Any

from sleuth.agents.policies.base import Policy
from sleuth.agents.policies.models import EMBEDDED, ModelNotFoundError, NotAModelDirectory, resolve_model
from sleuth.core.registry import Registry

# The scripted baselines by name: a class `(tokenizer, seed=...) -> Policy` each, imported on first use.
SCRIPTED_POLICIES: Registry[Any] = Registry("scripted policy")
SCRIPTED_POLICIES.register("random", "sleuth.agents.policies.scripted:RandomReader", "sleuth")
SCRIPTED_POLICIES.register("first-k", "sleuth.agents.policies.scripted:FirstKReader", "sleuth")
SCRIPTED_POLICIES.register("oracle", "sleuth.agents.policies.scripted:Oracle", "sleuth")
SCRIPTED_POLICIES.register("oracle-title", "sleuth.agents.policies.scripted:TitleOracle", "sleuth")
SCRIPTED_POLICIES.register("lexical", "sleuth.agents.policies.scripted:LexicalReader", "sleuth")
SCRIPTED_POLICIES.register("oracle-lexical", "sleuth.agents.policies.scripted:LexicalOracle", "sleuth")
SCRIPTED_POLICIES.register("noop", "sleuth.agents.policies.scripted:Noop", "sleuth")
SCRIPTED_POLICIES.register("random-legal", "sleuth.agents.policies.scripted:RandomLegal", "sleuth")


def load_tokenizer(model: str = EMBEDDED) -> Any:
    """`model`'s tokenizer; where transformers is not installed (the core install) the model-less
    `ByteChatTokenizer`, with which a scripted policy's episodes score the same."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        import sys

        from sleuth.agents.byte_chat import ByteChatTokenizer

        print("transformers is not installed: scripted policies render with a byte-level ChatML tokenizer "
              "(the same scores; token counts are bytes)", file=sys.stderr)
        return ByteChatTokenizer()
    return AutoTokenizer.from_pretrained(resolve_model(model))


def load_policy(spec: str, tokenizer_model: str = EMBEDDED, seed: int = 0, **kwargs: Any) -> Policy:
    """Scripted baselines render with `tokenizer_model`'s tokenizer; anything else loads a transformers model."""
    if spec in SCRIPTED_POLICIES:
        return SCRIPTED_POLICIES.get(spec)(load_tokenizer(tokenizer_model), seed=seed)
    try:
        resolve_model(spec)
    except NotAModelDirectory:
        raise  # a path that exists: what it lacks is the message, not a list of policy names
    except ModelNotFoundError:
        import difflib

        names = [EMBEDDED, *SCRIPTED_POLICIES.names()]
        close = difflib.get_close_matches(spec, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ModelNotFoundError(f"unknown policy {spec!r}{hint}: not one of {', '.join(names)}, not an existing "
                                 "path, not a model in the local Hugging Face cache (nothing is downloaded here)"
                                 ) from None
    from sleuth.agents.policies.hf import TransformersPolicy

    return TransformersPolicy(spec, **kwargs)
