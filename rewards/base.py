"""The estimator contract: trajectories and their tasks in, one advantage per policy token out.

An estimator sees only `Trajectory` objects and the `Task`s they ran (the rewards folder never touches the
optimiser) and never writes into them. Every estimator is an `Estimator`: the trainer calls `est(trajs,
tasks)` and gets `Advantages` (per trajectory, aligned with its action tokens in order:
`traj.num_policy_tokens` values, or `(tokens, K)` granularities that the trainer mixes when `est.mixing` is
set) plus the estimator's own metrics. Between steps it calls `refresh` when `refresh_due(step)` says so.
Estimators are registered by name (`ESTIMATORS`, one `sleuth.core.registry.Registry`) and built from a config
with keyword arguments by `make`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np

from sleuth.agents.trajectory import Trajectory
from sleuth.core.registry import Registry

ESTIMATOR_GROUP = "sleuth.estimators"


@dataclass
class Advantages:
    values: list[np.ndarray]  # one array per trajectory: (tokens,) or (tokens, K)
    metrics: dict[str, list[float]] = field(default_factory=dict)  # e.g. "step/info_gain/gold_prob": per read turn


@dataclass(frozen=True)
class MixingSpec:
    """What the trainer needs to mix K advantage granularities per token (GEAR's `gear_mix`)."""
    granularities: int
    mixer_lr: float = 1e-3
    entropy_coef: float = 0.01
    ema_decay: float = 0.99
    distill_coef: float = 0.1


class Estimator(ABC):
    """An advantage estimator. `step_source` is a step-reward estimator this one is built on (information
    gain inside GiGPO, CW-GRPO-adv and GEAR-mix): refreshes and policy checks reach it by default."""

    mixing: MixingSpec | None = None
    step_source: Estimator | None = None
    # True when the outcome advantage is taken relative to the other members of the trajectory's group (a
    # group mean, std or leave-one-out baseline): a group of one then has no outcome signal at all, so
    # `rollout.group_size: 1` is refused before anything loads. Every estimator sleuth ships baselines its
    # outcome on the group; one that scores a lone episode on its own (an absolute reward, a learned value)
    # sets it False. Read from the class, without building it (`declared`).
    group_relative: ClassVar[bool] = True
    # True when it can train a user's agent run through the gateway (`agent:` in a config): it needs no env state
    # (no replay, no env observations beyond the reads the gateway recognises). Read from the class, as above.
    supports_agents: ClassVar[bool] = False
    # True when its advantage is one number per episode, so an episode recorded as several segments (an agent that
    # rewrote its history) trains each segment with it (`rewards.episodes.per_episode`).
    supports_segments: ClassVar[bool] = False

    @abstractmethod
    def __call__(self, trajs: Sequence[Trajectory], tasks: Mapping[str, Any]) -> Advantages: ...

    def refresh_due(self, step: int) -> bool:
        """Whether the trainer should hand the policy's weights to `refresh` after optimizer step `step`; the
        trainer also asks for step 0, before the first step (a fresh start or a resume), so an estimator that
        tracks the policy starts from the policy's weights."""
        return self.step_source is not None and self.step_source.refresh_due(step)

    def refresh(self, state: Mapping[str, Any]) -> None:
        if self.step_source is not None:
            self.step_source.refresh(state)

    def check_policy(self, tokenizer: Any) -> None:
        """Called once before training with the policy's tokenizer; raises ValueError for a policy this
        estimator cannot score (e.g. a reader that would read the policy's token ids with another vocabulary)."""
        if self.step_source is not None:
            self.step_source.check_policy(tokenizer)


Flag = Literal["group_relative", "supports_agents", "supports_segments"]
ESTIMATORS: Registry[Callable[..., Estimator]] = Registry("advantage estimator", group=ESTIMATOR_GROUP)


def register(name: str, value: Callable[..., Estimator] | str | None = None, source: str = "user") -> Any:
    """Add estimator `name`: an `Estimator` subclass or a factory of one, or a "module:attr" string imported
    when first made. Without `value` it is the decorator `@sleuth.rewards.register("name")`, which registers
    what it decorates through the same call."""
    if value is None:
        return ESTIMATORS.decorator(name, source)
    return ESTIMATORS.register(name, value, source)


def names() -> list[str]:
    """The registered estimators, plugins' included."""
    return ESTIMATORS.names()


def declared(name: str, flag: Flag) -> bool | None:
    """A class flag of estimator `name` (`group_relative`, `supports_agents`, `supports_segments`), read without
    building it (building may load a reader model): from the registered class, or from the class a registered
    factory's return annotation names; None when neither says (an unknown name included: building it reports
    that)."""
    import typing

    try:
        factory = ESTIMATORS.get(name)
    except LookupError:
        return None
    cls: Any = factory
    if not isinstance(factory, type):
        try:
            cls = typing.get_type_hints(factory).get("return")
        except Exception:  # an annotation that does not resolve declares nothing
            return None
    if isinstance(cls, type) and issubclass(cls, Estimator):
        return {"group_relative": cls.group_relative, "supports_agents": cls.supports_agents,
                "supports_segments": cls.supports_segments}[flag]
    return None


def supporting(flag: Flag) -> list[str]:
    """The registered estimators (plugins' included) that declare `flag`."""
    return [n for n in names() if declared(n, flag)]


def make(name: str, **kwargs: Any) -> Estimator:
    """Build a registered estimator; unknown names and unknown arguments fail with the valid choices."""
    factory = ESTIMATORS.get(name)
    try:
        est = factory(**kwargs)
    except TypeError as e:
        raise ValueError(f"bad arguments for estimator {name!r}: {e}") from None
    if not isinstance(est, Estimator):
        raise TypeError(f"estimator {name!r} built a {type(est).__name__}, not a sleuth.rewards.Estimator subclass")
    return est


# -- helpers shared by estimators -------------------------------------------------------------------
def outcome(traj: Trajectory) -> float:
    """The outcome reward: the sum of the env's step rewards (the verdict's score for QA envs)."""
    return float(traj.reward)


def groups(trajs: Sequence[Trajectory]) -> dict[str, list[int]]:
    """Indices of trajectories per group key (the task id when no group was set)."""
    out: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(trajs):
        out[t.group or t.task_id].append(i)
    return dict(out)


def per_token(traj: Trajectory, value: float) -> np.ndarray:
    """One trajectory-level advantage broadcast over its action tokens."""
    return np.full(traj.num_policy_tokens, value, dtype=np.float64)


def per_turn(traj: Trajectory, values: Sequence[float]) -> np.ndarray:
    """Turn-level advantages (one per turn) broadcast over each turn's action tokens."""
    if len(values) != len(traj.turns):
        raise ValueError(f"{len(values)} turn values for {len(traj.turns)} turns")
    return np.concatenate([np.full(len(t.action_ids), v, dtype=np.float64)
                           for t, v in zip(traj.turns, values, strict=True)]
                          or [np.zeros(0)])


def discounted_returns(rewards: Sequence[float], gamma: float) -> np.ndarray:
    """G_t = Σ_{k≥t} γ^{k−t} r_k for every t."""
    out, acc = np.zeros(len(rewards)), 0.0
    for t in reversed(range(len(rewards))):
        acc = rewards[t] + gamma * acc
        out[t] = acc
    return out
