"""`Turn` and `Trajectory`: the exact token-level record of an episode (token-in/token-out).

A trajectory's token sequence is `prompt_ids + Σ (action_ids + observation_ids)`: the policy's own ids,
never re-derived from text, and the ids the agent loop appended after them. The loss mask is 1 exactly on
action ids. What a turn read is a typed field (`Turn.read`), not a key of the env's `info`."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from sleuth.verifiers.base import Verdict


@dataclass
class ReadEvent:
    """One document the env showed (DocRead's `read`, or any env that reports `info["read"]`)."""
    doc: int | str
    title: str = ""
    gold: bool | None = None  # None: the env does not know the gold documents
    reread: bool = False
    turn: int = 0
    shown: bool = True  # False: the episode ended on this turn, so the policy never saw the document
    answer: bool | None = None  # the document holds the task's answer; None: unknown, or no answer is a span

    @classmethod
    def from_info(cls, read: dict[str, Any]) -> ReadEvent:
        if "doc" not in read:
            raise ValueError(f"a read event needs a 'doc'; got {read!r}")
        known = {k: read[k] for k in ("doc", "title", "gold", "reread", "turn", "shown", "answer") if k in read}
        return cls(**known)


@dataclass
class Turn:
    action_ids: list[int]
    action_logprobs: list[float]  # sampling logprobs from the rollout engine, one per action id
    action_text: str
    observation_ids: list[int] = field(default_factory=list)  # empty after the final turn
    observation: str = ""
    tool_call: dict[str, Any] | None = None
    error: str | None = None  # malformed call, unknown tool, bad arguments, tool error
    reward: float = 0.0  # the env's reward for this step
    info: dict[str, Any] = field(default_factory=dict)  # the env's step info (chat messages dropped)
    policy_version: int = 0
    finish_reason: str = "stop"  # "stop" (end-of-turn token) or "length" (max_tokens hit)
    read: ReadEvent | None = None  # the document this turn read, if any

    def __post_init__(self) -> None:
        if isinstance(self.read, dict):
            self.read = ReadEvent.from_info(self.read)
        if len(self.action_logprobs) != len(self.action_ids):
            raise ValueError(f"{len(self.action_ids)} action ids but {len(self.action_logprobs)} logprobs")


@dataclass
class Trajectory:
    task_id: str
    env_id: str
    prompt_ids: list[int]
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0  # sum of the env's step rewards (the verdict's score for outcome-only envs)
    verdict: Verdict | None = None  # the verifier's outcome; None: the episode was not scored
    terminated: bool = False
    truncated: bool = False
    # "final", "budget", "context_limit", "prompt_too_long" (the first prompt does not fit the context),
    # "no_calls" (an agent that answered without calling the model); failed episodes: "reset_error",
    # "env_error", "engine_error", "agent_error", "gateway_error", "verifier_error"
    stop_reason: str = ""
    # set when the episode failed for infrastructure reasons (the env could not reset or step, the engine
    # could not generate): such an episode is no answer, so it is never scored nor trained on, and a
    # resumed run retries it
    error: str | None = None
    group: str = ""  # group key for group-relative advantages (the task id by default)
    # An episode recorded as several trajectories (an agent behind the gateway that rewrote its history):
    # the episode's id, this record's place and their number; "" / 0 / 1 for an episode of one record.
    episode: str = ""
    segment: int = 0
    segments: int = 1
    # A branch (`agents.loop.scheduler.Branch`): how many turns of a recorded episode it continued from (its
    # prompt holds them); 0 for an episode from the start.
    branch_at: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    # -- token views --------------------------------------------------------------------------
    def token_ids(self) -> list[int]:
        ids = list(self.prompt_ids)
        for t in self.turns:
            ids += t.action_ids
            ids += t.observation_ids
        return ids

    def loss_mask(self) -> list[int]:
        mask = [0] * len(self.prompt_ids)
        for t in self.turns:
            mask += [1] * len(t.action_ids)
            mask += [0] * len(t.observation_ids)
        return mask

    def sampling_logprobs(self) -> list[float]:
        """Rollout logprobs aligned with `token_ids()`; 0.0 where the mask is 0."""
        lps = [0.0] * len(self.prompt_ids)
        for t in self.turns:
            lps += t.action_logprobs
            lps += [0.0] * len(t.observation_ids)
        return lps

    @property
    def failed(self) -> bool:
        """An infrastructure failure, not an outcome of the policy (see `error`)."""
        return self.error is not None

    @property
    def num_policy_tokens(self) -> int:
        return sum(len(t.action_ids) for t in self.turns)

    # -- serialisation ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        d = dict(d)
        d["turns"] = [Turn(**t) for t in d.get("turns", [])]
        d["verdict"] = Verdict.from_dict(d["verdict"]) if d.get("verdict") is not None else None
        return cls(**d)

    @classmethod
    def from_json(cls, line: str) -> Trajectory:
        return cls.from_dict(json.loads(line))
