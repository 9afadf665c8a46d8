"""Verifiers by name, and one generic entry point: `score(name, record, response) -> float`."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from sleuth.registry import Registry
from sleuth.verifiers.base import Verdict, Verifier


def _qa() -> Verifier:
    from sleuth.verifiers.qa import QAVerifier

    return QAVerifier()


def _code() -> Verifier:
    from sleuth.verifiers.code import CodeVerifier

    return CodeVerifier()


def _swe() -> Verifier:
    from sleuth.verifiers.swe import SWEVerifier

    return SWEVerifier()


# name → a factory of the verifier; plugins declare theirs under the entry-point group `sleuth.verifiers`
VERIFIERS: Registry[Callable[[], Verifier]] = Registry("verifier", group="sleuth.verifiers")
VERIFIERS.register("qa", _qa, "sleuth")
VERIFIERS.register("code", _code, "sleuth")
VERIFIERS.register("swe", _swe, "sleuth")


@cache
def get_verifier(name: str) -> Callable[..., Verdict]:
    """A shared instance per name (the code verifier holds a sandbox)."""
    return VERIFIERS.get(name)()


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
