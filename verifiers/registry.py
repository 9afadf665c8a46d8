"""Verifiers by name, and one generic entry point: `score(name, record, response) -> float`."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from sleuth.verifiers.base import Verdict

VERIFIERS = ("qa", "code")


@cache
def get_verifier(name: str) -> Callable[..., Verdict]:
    """A shared instance per name (the code verifier holds a sandbox)."""
    if name == "qa":
        from sleuth.verifiers.qa import QAVerifier

        return QAVerifier()
    if name == "code":
        from sleuth.verifiers.code import CodeVerifier

        return CodeVerifier()
    import importlib.metadata

    for ep in importlib.metadata.entry_points(group="sleuth.verifiers"):  # plugins: name → "module:factory"
        if ep.name == name:
            return ep.load()()
    raise ValueError(f"unknown verifier {name!r}; known: {', '.join(VERIFIERS)} (and plugins)")


def extractor(name: str) -> Callable[[str], str]:
    """What part of a free-form reply the verifier scores."""
    from sleuth.verifiers.extract import extract_answer, extract_code

    return extract_code if name == "code" else extract_answer


def verdict(name: str, record: dict[str, Any], response: str, extract: bool = True) -> Verdict:
    text = extractor(name)(response) if extract else response
    return get_verifier(name)(record, text)


def score(name: str, record: dict[str, Any], response: str, extract: bool = True) -> float:
    """Score a reply to a task record in its data set's own layout (HotpotQA / MuSiQue / NQ-open for "qa",
    MBPP / HumanEval for "code")."""
    return verdict(name, record, response, extract).score
