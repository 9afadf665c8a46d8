"""Verifiers by name, and one generic entry point: `score(name, record, response) -> float`."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from sleuth.registry import Registry, UnknownNameError
from sleuth.verifiers.base import Verdict, Verifier

# name → a factory of the verifier (a class is one); plugins declare theirs under the entry-point group
# `sleuth.verifiers`
VERIFIERS: Registry[Callable[[], Verifier]] = Registry("verifier", group="sleuth.verifiers")
VERIFIERS.register("qa", "sleuth.verifiers.qa:QAVerifier", "sleuth")
VERIFIERS.register("code", "sleuth.verifiers.code:CodeVerifier", "sleuth")
VERIFIERS.register("swe", "sleuth.verifiers.swe:SWEVerifier", "sleuth")

# verifier name → what part of a free-form reply it scores; a verifier without one scores the reply as it
# is. Plugins declare theirs under `sleuth.extractors`, named as their verifier.
EXTRACTORS: Registry[Callable[[str], str]] = Registry("reply extractor", group="sleuth.extractors")
EXTRACTORS.register("qa", "sleuth.verifiers.extract:extract_answer", "sleuth")
EXTRACTORS.register("code", "sleuth.verifiers.extract:extract_code", "sleuth")
EXTRACTORS.register("swe", "sleuth.verifiers.extract:extract_diff", "sleuth")


@cache
def get_verifier(name: str) -> Callable[..., Verdict]:
    """A shared instance per name (the code verifier holds a sandbox)."""
    return VERIFIERS.get(name)()


def _as_is(text: str) -> str:
    return text


@cache
def extractor(name: str) -> Callable[[str], str]:
    """What part of a free-form reply verifier `name` scores (`EXTRACTORS`; the whole reply if none)."""
    try:
        return EXTRACTORS.get(name)
    except UnknownNameError:
        return _as_is


def verdict(name: str, record: dict[str, Any], response: str, extract: bool = True, **context: Any) -> Verdict:
    """`context`: the verifier's keyword context (`evidence`: the titles an agent was seen reading)."""
    text = extractor(name)(response) if extract else response
    return get_verifier(name)(record, text, **context)


def score(name: str, record: dict[str, Any], response: str, extract: bool = True) -> float:
    """Score a reply to a task record in its data set's own layout (HotpotQA / MuSiQue / NQ-open for "qa",
    MBPP / HumanEval for "code", a SWE task record for "swe" with a unified diff as the response)."""
    return verdict(name, record, response, extract).score
