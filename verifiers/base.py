"""`Verdict` and the `Verifier` contract: pure, deterministic scoring that needs neither envs nor torch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from sleuth.core.errors import InfraFailure


@dataclass
class Verdict:
    """The outcome of scoring one response: `score` is the reward, `details` says why, `response` is the text
    scored (kept so the episode can be scored again, e.g. by a judge, without the env)."""

    score: float
    details: dict[str, Any] = field(default_factory=dict)
    response: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Verdict:
        return cls(score=float(d["score"]), details=dict(d.get("details") or {}), response=d.get("response"))


class Verifier(Protocol):
    """`verifier(task, response, **context) -> Verdict`. `task` is a `sleuth.tasks.Task`; extra
    keyword context (e.g. `evidence`) is optional and named by the verifier that wants it."""

    def __call__(self, task: Any, response: str, **context: Any) -> Verdict: ...


class GroupVerifier(Protocol):
    """`score_group(task, responses, contexts) -> [Verdict]`: the members of one group scored together (a judge
    that ranks them in one call); `contexts[i]` is member i's keyword context."""

    def score_group(self, task: Any, responses: Sequence[str],
                    contexts: Sequence[Mapping[str, Any]]) -> list[Verdict]: ...


class CannotScore(InfraFailure):
    """This verifier cannot score the record on this machine (e.g. a backend it needs is missing). Not a
    verdict on the response: batch scoring writes it as an error line, the server answers 503."""
