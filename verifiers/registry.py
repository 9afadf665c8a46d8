"""Verifiers by name, and one generic entry point: `score(name, record, response) -> float`."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from sleuth.verifiers.base import Verdict

VERIFIERS = ("qa", "code", "swe")


@cache
def get_verifier(name: str) -> Callable[..., Verdict]:
    """A shared instance per name (the code verifier holds a sandbox)."""
    if name == "qa":
        from sleuth.verifiers.qa import QAVerifier

        return QAVerifier()
    if name == "code":
        from sleuth.verifiers.code import CodeVerifier

        return CodeVerifier()
    if name == "swe":
        from sleuth.verifiers.swe import SWEVerifier

        return SWEVerifier()
    import difflib
    import importlib.metadata

    plugins = {ep.name: ep for ep in importlib.metadata.entry_points(group="sleuth.verifiers")}  # name → factory
    if name in plugins:
        return plugins[name].load()()
    known = [*VERIFIERS, *sorted(plugins)]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"unknown verifier {name!r}{hint}; known: {', '.join(known)}")


def extractor(name: str) -> Callable[[str], str]:
    """What part of a free-form reply the verifier scores (a plugin's verifier gets the reply as it is)."""
    from sleuth.verifiers.extract import extract_answer, extract_code, extract_diff

    return {"qa": extract_answer, "code": extract_code, "swe": extract_diff}.get(name, lambda text: text)


def verdict(name: str, record: dict[str, Any], response: str, extract: bool = True) -> Verdict:
    text = extractor(name)(response) if extract else response
    return get_verifier(name)(record, text)


def score(name: str, record: dict[str, Any], response: str, extract: bool = True) -> float:
    """Score a reply to a task record in its data set's own layout (HotpotQA / MuSiQue / NQ-open for "qa",
    MBPP / HumanEval for "code", a SWE task record for "swe" with a unified diff as the response)."""
    return verdict(name, record, response, extract).score
