"""What a sleuth env tells the agent loop beyond gymnasium's tuple: one typed object under one key of `info`
(`INFO_KEY`), written by envs and families and read by the loop, the scripted policies and the outbound
adapters; no layer reads a string key another wrote. The rest of `info` (an env's own facts: `turn`,
`task_id`, `response`, ...) is the env's, recorded with the turn and read by nobody else.

Over the wire (`sleuth serve env`, a foreign venv's env server) the object travels as its `to_dict()` and
`reset_info` / `step_info` rebuild it, so a remote env's info reads the same as a local one's."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sleuth.verifiers.base import Verdict

INFO_KEY = "sleuth"


@dataclass
class ResetInfo:
    """An episode's start: the chat it opens with and how the policy must act in it."""

    messages: list[dict[str, Any]]  # system + user: what the policy sees first
    tools: list[dict[str, Any]] = field(default_factory=list)  # OpenAI tool schemas
    format: str = "json"  # the tool-call format (`envs.parsers.PARSERS`); `template`: the chat template shows tools
    budget: int | None = None  # tool calls (or moves) the episode may make before it is cut
    # The env's class as "module:Class": whose `oracle` the scripted oracle plays (`envs.registry.oracle_of`)
    env: str | None = None
    env_args: dict[str, Any] = field(default_factory=dict)  # what rebuilds the env (an oracle regenerates gold)
    legal_actions: list[str] | None = None  # the moves a text env accepts first (None: it does not say)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ResetInfo:
        return cls(**d)


@dataclass
class StepInfo:
    """One step's outcome as the loop uses it."""

    messages: list[dict[str, Any]] = field(default_factory=list)  # what the policy sees next (empty: it ended)
    tool_call: dict[str, Any] | None = None  # the call parsed from the action (None: none parsed)
    error: str | None = None  # what was wrong with the action (it still used a turn)
    read: dict[str, Any] | None = None  # a document the env showed (`agents.trajectory.ReadEvent` fields)
    verdict: Verdict | None = None  # the score, on the step that ended the episode
    legal_actions: list[str] | None = None  # the moves a text env accepts next
    stop_reason: str | None = None  # why the env ended the episode, where it names it (e.g. `invalid_actions`)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["verdict"] = self.verdict.to_dict() if self.verdict is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepInfo:
        verdict = d.get("verdict")
        return cls(**{**d, "verdict": Verdict.from_dict(verdict) if verdict is not None else None})


def reset_info(info: dict[str, Any]) -> ResetInfo:
    """The `ResetInfo` of a reset's `info` (rebuilt from its dict where it came over the wire)."""
    part = _part(info, "reset")
    return part if isinstance(part, ResetInfo) else ResetInfo.from_dict(part)


def step_info(info: dict[str, Any]) -> StepInfo:
    """The `StepInfo` of a step's `info` (rebuilt from its dict where it came over the wire)."""
    part = _part(info, "step")
    return part if isinstance(part, StepInfo) else StepInfo.from_dict(part)


def extras(info: dict[str, Any]) -> dict[str, Any]:
    """The env's own part of `info`: everything but the typed object."""
    return {k: v for k, v in info.items() if k != INFO_KEY}


def wire(info: dict[str, Any]) -> dict[str, Any]:
    """`info` as JSON can carry it: the typed object as its dict."""
    part = info.get(INFO_KEY)
    return {**info, INFO_KEY: part.to_dict()} if isinstance(part, (ResetInfo, StepInfo)) else info


def _part(info: dict[str, Any], what: str) -> Any:
    if INFO_KEY not in info:
        raise TypeError(f"the env's {what} info has no {INFO_KEY!r} entry (envs.outcome): a sleuth env writes its "
                        f"{'ResetInfo' if what == 'reset' else 'StepInfo'} there; keys given: {sorted(info)}")
    return info[INFO_KEY]
