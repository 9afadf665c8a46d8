"""Verifiers by name, and one generic entry point: `score(name, record, response) -> float`."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from sleuth.core.registry import Registry, UnknownNameError
from sleuth.verifiers.base import CannotScore, GroupVerifier, Verdict, Verifier

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


JUDGE_PREFIX = "judge:"  # `judge:FILE`: an LLM judge whose settings are in FILE (`sleuth.verifiers.judge`)


@cache
def _judge(path: str) -> Any:
    from sleuth.verifiers.judge import load_judge

    return load_judge(path, rules=verdict)


def group_verifier(name: str) -> GroupVerifier | None:
    """The group verifier `name` names (a `judge:FILE` whose mode is `group`), or None for a per-response one."""
    if not name.startswith(JUDGE_PREFIX):
        VERIFIERS.get(name)
        return None
    from sleuth.verifiers.judge import GroupJudge

    judge = _judge(name.removeprefix(JUDGE_PREFIX))
    return judge if isinstance(judge, GroupJudge) else None


@cache
def get_verifier(name: str) -> Callable[..., Verdict]:
    """A shared instance per name (the code verifier holds a sandbox; a judge its client and cache): a registered
    name, or `judge:FILE`. A group judge is refused here, where responses come one at a time."""
    if name.startswith(JUDGE_PREFIX):
        if group_verifier(name) is not None:
            raise CannotScore(f"{name} is a group judge: it scores the members of a group together (sleuth train, "
                              f"sleuth eval --samples K, TRL's adapter); here responses come one at a time: set "
                              f"mode: pointwise in its file")
        return _judge(name.removeprefix(JUDGE_PREFIX))
    return VERIFIERS.get(name)()


def verifier_names() -> str:
    """The names a verifier can be given by, for help texts and errors."""
    return ", ".join([*VERIFIERS.names(), f"{JUDGE_PREFIX}FILE (an LLM judge)"])


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
    v = get_verifier(name)(record, text, **context)
    return v if v.response is not None else Verdict(v.score, v.details, response=text)


def score(name: str, record: dict[str, Any], response: str, extract: bool = True) -> float:
    """Score a reply to a task record in its data set's own layout (HotpotQA / MuSiQue / NQ-open for "qa",
    MBPP / HumanEval for "code", a SWE task record for "swe" with a unified diff as the response)."""
    return verdict(name, record, response, extract).score
