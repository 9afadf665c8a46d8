"""`load_policy("smollm2" | "random" | "first-k" | "oracle" | "oracle-title" | "noop" | <local path> | <hub id>)`."""

from __future__ import annotations

from typing import Any

from sleuth.agents.policy import Policy

SCRIPTED = ("random", "first-k", "oracle", "oracle-title", "noop")


def load_tokenizer(model: str = "smollm2") -> Any:
    from transformers import AutoTokenizer

    from sleuth.agents.models import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(model))


def load_policy(spec: str, tokenizer_model: str = "smollm2", seed: int = 0, **kwargs: Any) -> Policy:
    """Scripted baselines render with `tokenizer_model`'s tokenizer; anything else loads a transformers model."""
    from sleuth.agents import scripted

    classes = {"random": scripted.RandomReader, "first-k": scripted.FirstKReader, "oracle": scripted.Oracle,
               "oracle-title": scripted.TitleOracle, "noop": scripted.Noop}
    if spec in classes:
        return classes[spec](load_tokenizer(tokenizer_model), seed=seed)
    from sleuth.agents.hf import TransformersPolicy
    from sleuth.agents.models import EMBEDDED, ModelNotFoundError, resolve_model

    try:
        resolve_model(spec)
    except ModelNotFoundError:
        import difflib

        names = [EMBEDDED, *classes]
        close = difflib.get_close_matches(spec, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ModelNotFoundError(f"unknown policy {spec!r}{hint}: not one of {', '.join(names)}, not an existing path, "
                                 "not a model in the local Hugging Face cache (nothing is downloaded here)") from None

    return TransformersPolicy(spec, **kwargs)
