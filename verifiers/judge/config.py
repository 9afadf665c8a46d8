"""A judge's settings, read from one YAML file: the verifier name `judge:FILE` names it everywhere a verifier
name goes (`sleuth eval --verifier`, `sleuth score`, a training config's `verifier`, the TRL / verl / OpenRLHF
adapters, `sleuth serve verifier`), so one file is the judge in every place it is used."""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from sleuth.core.errors import BadInput

MODES = ("pointwise", "group")
GROUP_REWARDS = ("score", "rank")
SHOWS = ("answer", "transcript")


class JudgeConfigError(BadInput):
    """A judge file that cannot be used: the message names the file and the setting."""


@dataclass(frozen=True)
class JudgeConfig:
    """`base_url` and `model`: any OpenAI-compatible endpoint (a hosted API, vLLM, `sleuth serve gateway`).
    `mode`: `pointwise` scores each response on its own; `group` shows the members of a group together in one
    call and turns the judge's relative scores into rewards. `rubric` is what the judge is told to judge by;
    `prompt` (optional) replaces the built-in prompt of the mode (placeholders: `{rubric}`, `{question}`,
    `{reference}`, `{response}`, `{scale}`, and for a group `{members}`, `{count}`). `score_pattern` is the
    regular expression that finds a score in the reply (pointwise: one group, the last match counts; group: two
    groups, a member's number and its score, one match per member); scores run from 0 to `scale`. `labels`
    (pointwise) reads a verdict word instead (e.g. `{yes: 1, no: 0}`: the first of them in the reply counts), which
    small judges follow more often than a number format.
    `weights`: the judge's score beside other verifiers' (a registered name, or `env`: the env's own verdict where
    episodes are rescored), as their weighted mean."""

    base_url: str
    model: str
    mode: str = "pointwise"
    rubric: str = "The response answers the question correctly and completely, with no wrong claims."
    prompt: str | None = None
    system: str = "You are a strict, fair grader. Follow the output format exactly."
    score_pattern: str | None = None  # None: the mode's own (`prompts.SCORE_PATTERNS`)
    labels: dict[str, float] | None = None  # pointwise: words the judge answers with, each a score in [0, 1]
    scale: float = 10.0
    show: str = "answer"  # answer: the scored reply; transcript: the episode's turns (where episodes are rescored)
    max_chars: int = 4000  # a response or transcript longer than this is shown cut, with a marker
    reference: bool = True  # show the task's gold answer (where it has one) as `{reference}`
    api_key_env: str = "OPENAI_API_KEY"  # the environment variable holding the key ("" for none)
    temperature: float = 0.0
    max_tokens: int = 256
    timeout_s: float = 60.0
    retries: int = 2  # further tries of a call that failed or timed out (or, at temperature > 0, gave no score)
    backoff_s: float = 1.0
    concurrency: int = 8  # judge calls in flight at once
    cache: str | None = None  # a JSONL file of earlier replies (relative: to the judge file): a re-score is free
    group_reward: str = "score"  # group: `score` (the judge's score / scale) or `rank` (ranks spaced evenly in [0, 1])
    shuffle: bool = True  # group: members shown in an order drawn from the responses, undone after (position bias)
    seed: int = 0
    weights: dict[str, float] = field(default_factory=lambda: {"judge": 1.0})
    source: str = ""  # the file this was read from

    def __post_init__(self) -> None:
        where = f"judge {self.source or '(inline)'}"
        if self.mode not in MODES:
            raise JudgeConfigError(f"{where}: mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.show not in SHOWS:
            raise JudgeConfigError(f"{where}: show must be one of {', '.join(SHOWS)}, got {self.show!r}")
        if not self.base_url or not self.model:
            raise JudgeConfigError(f"{where}: base_url and model are required (an OpenAI-compatible endpoint)")
        for name in ("scale", "timeout_s"):
            if not getattr(self, name) > 0:
                raise JudgeConfigError(f"{where}: {name} must be > 0")
        for name in ("retries", "concurrency", "max_tokens", "max_chars"):
            if getattr(self, name) < (0 if name == "retries" else 1):
                raise JudgeConfigError(f"{where}: {name} is out of range ({getattr(self, name)})")
        if "judge" not in self.weights:
            raise JudgeConfigError(f"{where}: weights must give the judge a weight (e.g. {{judge: 0.5, qa: 0.5}})")
        if not all(isinstance(w, int | float) and math.isfinite(w) and w >= 0 for w in self.weights.values()) \
                or sum(self.weights.values()) <= 0:
            raise JudgeConfigError(f"{where}: weights must be finite, ≥ 0 and not all 0, got {self.weights}")
        if self.labels is not None:
            if self.mode == "group":
                raise JudgeConfigError(f"{where}: labels are for a pointwise judge (a group judge scores each member)")
            if not self.labels or not all(isinstance(k, str) and k.strip() and isinstance(v, int | float)
                                          and 0 <= v <= 1 for k, v in self.labels.items()):
                raise JudgeConfigError(f"{where}: labels must map words to scores in [0, 1], e.g. {{yes: 1, no: 0}}")
        if self.group_reward not in GROUP_REWARDS:
            raise JudgeConfigError(f"{where}: group_reward must be one of {', '.join(GROUP_REWARDS)}")
        if self.score_pattern is not None:
            try:
                groups = re.compile(self.score_pattern).groups
            except re.error as e:
                raise JudgeConfigError(f"{where}: score_pattern is not a regular expression ({e})") from None
            if groups != (2 if self.mode == "group" else 1):
                want = "two groups (member number, score)" if self.mode == "group" else "one group (the score)"
                raise JudgeConfigError(f"{where}: score_pattern needs {want}, has {groups}")

    @property
    def rule_terms(self) -> dict[str, float]:
        """The weights of the terms beside the judge."""
        return {k: w for k, w in self.weights.items() if k != "judge"}

    @classmethod
    def load(cls, path: str | Path) -> JudgeConfig:
        p = Path(path)
        try:
            raw = yaml.safe_load(p.read_text())
        except OSError as e:
            raise JudgeConfigError(f"judge {path}: cannot read it ({e.strerror})") from None
        except yaml.YAMLError as e:
            raise JudgeConfigError(f"judge {path}: not YAML ({str(e).splitlines()[0]})") from None
        if not isinstance(raw, dict):
            raise JudgeConfigError(f"judge {path}: must be a mapping of settings, got {type(raw).__name__}")
        known = {f.name for f in fields(cls)} - {"source"}
        for key in raw:
            if key not in known:
                near = difflib.get_close_matches(str(key), known, n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                raise JudgeConfigError(f"judge {path}: unknown setting {key!r}{hint}")
        cache = raw.get("cache")
        if cache is not None and not Path(cache).is_absolute():
            raw["cache"] = str(p.parent / cache)
        try:
            return cls(**raw, source=str(path))
        except TypeError as e:
            raise JudgeConfigError(f"judge {path}: {e}") from None
