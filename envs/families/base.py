"""What every foreign env family shares: the `FAMILY:ID` registry entry (`EnvFamily`), the error for a family whose
package is missing, and `TextGameEnv`, the Env contract over an env whose action is the policy's whole reply.

A text env's reply is the action as decoded from the policy's sampled ids; the loop records those ids and
never re-tokenises the text. Each observation is a user message, so any chat template renders it. Where the env
can tell which moves it would accept now, its reset and step info carry them as `legal_actions` (the
`random-legal` baseline plays one); the episode's score is its return, the sum of the env's rewards, unless the
family says otherwise (a game's result for the policy's seat).

A reply the env's harness refuses (no parseable call, an unknown tool, arguments its schema rejects) never reaches
the foreign env, so the env's own limits (five guesses, a step cap) never end an episode of refusals:
`max_invalid_actions` of them in a row end it (stop reason `invalid_actions`), scored as the family scores an
episode cut short — the policy's outcome, not an infrastructure failure."""

from __future__ import annotations

import importlib
from abc import abstractmethod
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, ClassVar

import gymnasium

from sleuth.core.errors import BadInput, InfraFailure
from sleuth.envs.base import TextSpace
from sleuth.envs.outcome import INFO_KEY, ResetInfo, StepInfo
from sleuth.envs.parsers import ToolCall
from sleuth.tasks.base import Task
from sleuth.tasks.seeds import seed_task, task_seed
from sleuth.verifiers.base import Verdict

FREE = "free"  # the harness of a text env: the whole reply is the action
# Refused replies in a row that end an episode: a policy that has not produced a valid call in eight tries rarely
# does on the ninth, and each try makes the next prompt longer.
MAX_INVALID_ACTIONS = 8


class MissingExtraError(ImportError, BadInput):
    """A family whose library is not installed: the message names the extra that installs it."""


class EnvFailure(InfraFailure):
    """The foreign env itself broke (it raised, or returned what its own API does not allow): the episode fails as
    an env failure, never scored, and is retried by the same command."""


def require(module: str, family: str, package: str) -> ModuleType:
    """Import a family's library, or say in one line which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtraError(f"{family}: envs need the `{package}` package ({e.name or module} is not importable): "
                                f"pip install 'sleuth[{family}]'") from None


@dataclass(frozen=True)
class EnvFamily:
    """One inbound family: `make(id, **env_args)` builds its env `FAMILY:id`; `ids()` lists the ids it knows (for
    "did you mean"; empty where ids are open-ended, e.g. a module path); `seeded`: its episodes come from seeds
    (`--tasks seeds:A-B`, no task file); `rows`: its seeds index the rows of a finite task set, so there are no
    default seed ranges (each run names its rows); `harness`: the harness its envs take by default; `modules`: an
    id may be `MODULE:ID`, where importing the user's MODULE registers ID with the family's library (`user_id`)."""

    name: str
    make: Any  # "module:function" or (env_id: str, **env_args) -> gymnasium.Env
    ids: Any = field(default=None)  # "module:function" or () -> list[str]; None: ids are not enumerable
    seeded: bool = True
    harness: str = FREE
    rows: bool = False
    modules: bool = False


def user_id(env_id: str) -> str | None:
    """The ID of a `MODULE:ID` after importing MODULE, which registers ID with its library as that library's docs
    have users do (`gem.register`, `ta.register`, `register_dataset` at import); None where MODULE is no module
    (the id is the library's own, e.g. GEM's `game:Sudoku-v0-easy`). The same rule as `openenv:MODULE:Class`."""
    module, sep, rest = env_id.partition(":")
    if not sep or not rest or not all(part.isidentifier() for part in module.split(".")):
        return None
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:  # MODULE itself missing: not a module; an import inside it failing: a fault
        if e.name and (module == e.name or module.startswith(e.name + ".")):
            return None
        raise
    return rest


def registered(env_id: str, registry: Container[str]) -> str:
    """The key of `registry` (a library's ids) that `env_id` names: itself, or the ID of `MODULE:ID` (`user_id`)."""
    if env_id in registry:
        return env_id
    named = user_id(env_id)
    if named is None or named not in registry:
        module = env_id.partition(":")[0]
        raise KeyError(f"{env_id!r} is not registered" + (f" (importing {module} registered no {named!r})"
                                                          if named is not None else ""))
    return named


class LegalMoves(Sequence[str]):
    """The moves an env accepts now, listed only when read: listing costs more than a step of a small game (GEM
    draws its random action 16 times), and only the `random-legal` baseline reads them. The agent loop reads a
    step's moves before the env's next step, so the env is still where the moves describe."""

    def __init__(self, list_moves: Callable[[], list[str] | None]):
        self._list, self._moves = list_moves, None

    @property
    def moves(self) -> list[str]:
        if self._moves is None:
            self._moves = self._list() or []
        return self._moves

    def __getitem__(self, i):  # type: ignore[override]
        return self.moves[i]

    def __len__(self) -> int:
        return len(self.moves)

    def __repr__(self) -> str:
        return f"LegalMoves({self.moves!r})"


@dataclass
class Move:
    """What one step of the foreign env gave, in its own terms."""

    observation: str
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    legal_actions: Sequence[str] | None = None
    details: dict[str, Any] = field(default_factory=dict)  # the family's own facts for the step's info
    tool_call: dict[str, Any] | None = None  # the call parsed from the reply (`StepInfo.tool_call`)
    error: str | None = None  # what was wrong with the reply (`StepInfo.error`)
    # the observation as the chat messages the policy sees next (tool results, a user turn); None: one user message
    messages: list[dict[str, Any]] | None = None
    refused: bool = False  # the harness refused the reply: it never reached the foreign env

    def chat(self) -> list[dict[str, Any]]:
        return self.messages if self.messages is not None else [{"role": "user", "content": self.observation}]


def _listed(actions: Sequence[str] | None) -> list[str] | None:
    return None if actions is None else list(actions)


class TextGameEnv(gymnasium.Env):
    """reset(options={"task": Task}) → (first observation, info); step(reply text) → the gymnasium 5-tuple. The
    task's seed (`seeds:` tasks, else one derived from its id) fixes the episode. `max_turns` truncates an episode
    the foreign env never ends; `max_invalid_actions` refused replies in a row (None: no limit) truncate it too. A
    foreign env that raises fails the episode (`EnvFailure`: the loop records an env error, not a score)."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    family: ClassVar[str] = ""
    harnesses: ClassVar[tuple[str, ...]] = (FREE,)  # the first is the default

    def __init__(self, env_id: str, *, harness: str | None = None, max_turns: int = 64,
                 system_prompt: str | None = None, tasks: list[Task] | None = None,
                 max_invalid_actions: int | None = MAX_INVALID_ACTIONS):
        harness = harness or self.harnesses[0]
        if harness not in self.harnesses:
            what = "takes the policy's whole reply as its action" if self.harnesses == (FREE,) else "acts through"
            raise ValueError(f"{self.family}:{env_id} {what} (harness {' or '.join(map(repr, self.harnesses))}), "
                             f"not the {harness!r} format")
        if max_turns < 1:
            raise ValueError(f"max_turns must be ≥ 1, got {max_turns}")
        if max_invalid_actions is not None and max_invalid_actions < 1:
            raise ValueError(f"max_invalid_actions must be ≥ 1 (or None: no limit), got {max_invalid_actions}")
        self.max_invalid_actions = max_invalid_actions
        self.env_id, self.max_turns, self.system_prompt, self.format = env_id, max_turns, system_prompt, harness
        self.tasks = list(tasks) if tasks else None
        self.observation_space = TextSpace(max_length=1 << 20)
        self.action_space = TextSpace(max_length=1 << 20)
        self.task: Task | None = None
        self.done = True

    # -- what a family implements ----------------------------------------------------------------------
    @abstractmethod
    def begin(self, task: Task, seed: int) -> Move:
        """Start the episode of `seed`: its first observation (and legal moves, where known)."""

    @abstractmethod
    def advance(self, action: str) -> Move:
        """Play the policy's reply."""

    def finish(self) -> None:
        """The episode ended (the foreign env ended it, or a limit did): give back what it held only while it ran
        (a server's session), so another episode may have it. It does not raise: the episode's outcome stands."""

    def verdict(self) -> Verdict:
        """The finished episode's score: its return."""
        return Verdict(self.episode_return, {"return": self.episode_return, "turns": self.turn})

    def seed_count(self) -> int | None:
        """How many episodes the env's seeds index where they index a finite set (seeds 0..n-1, e.g. a dataset's
        items); None: every seed makes an episode. A reset with neither seed nor task draws inside it."""
        return None

    def env_args(self) -> dict[str, Any]:
        """The arguments that rebuild this env (reset info's `env_args`: an oracle regenerates gold from them)."""
        return {}

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The OpenAI tool schemas of an env that acts through tools (reset info's `tools`); none for free text."""
        return []

    @classmethod
    def oracle(cls, task: Task, turn: int, start: ResetInfo) -> ToolCall | list[ToolCall]:
        """The reply of an agent that knows the gold (the `oracle` baseline): a call, or the calls of one reply
        (none: a reply without a call); a game has none."""
        raise ValueError(f"{cls.family} envs have no reference reply to play: use the random-legal baseline")

    @classmethod
    def entry_point(cls) -> str:
        return f"{cls.__module__}:{cls.__qualname__}"

    # -- gymnasium API -----------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        task = (options or {}).get("task")
        if task is None:
            task = (self.tasks[int(self.np_random.integers(len(self.tasks)))] if self.tasks
                    else seed_task(seed if seed is not None
                                   else int(self.np_random.integers(self.seed_count() or 1 << 31))))
        if isinstance(task, dict):
            task = Task.from_dict(task)
        self.task, self.turn, self.episode_return, self.done, self.refused_in_a_row = None, 0, 0.0, False, 0
        move = self._guarded(lambda: self.begin(task, task_seed(task)), "reset")
        self.task = task
        messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else [])
        messages += move.chat()
        start = ResetInfo(messages, self.tool_schemas(), self.format, self.max_turns, self.entry_point(),
                          self.env_args(), _listed(move.legal_actions))
        return move.observation, {INFO_KEY: start, "task_id": task.id}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.task is None or self.done:
            raise RuntimeError("call reset() before step() (the episode is over or never started)")
        if not isinstance(action, str):
            raise TypeError(f"the action must be text, got {type(action).__name__}")
        self.turn += 1
        move = self._guarded(lambda: self.advance(action), "step")
        self.episode_return += move.reward
        self.refused_in_a_row = self.refused_in_a_row + 1 if move.refused else 0
        runaway = self.max_invalid_actions is not None and self.refused_in_a_row >= self.max_invalid_actions
        truncated = move.truncated or (not move.terminated and (self.turn >= self.max_turns or runaway))
        out = StepInfo(tool_call=move.tool_call, error=move.error, legal_actions=_listed(move.legal_actions))
        if runaway and not move.terminated:
            out.stop_reason = "invalid_actions"
        if move.terminated or truncated:
            self.done = True
            out.verdict = self.verdict()
            self.finish()
        else:
            out.messages = move.chat()
        return move.observation, move.reward, move.terminated, truncated, {"turn": self.turn, **move.details,
                                                                           INFO_KEY: out}

    def _guarded(self, fn: Any, what: str) -> Move:
        try:
            move = fn()
        except (EnvFailure, MissingExtraError):
            raise
        except Exception as e:  # the foreign env's own bug or fault: this episode fails, the run goes on
            self.done = True
            raise EnvFailure(f"{self.family}:{self.env_id} raised in {what}: {type(e).__name__}: {e}") from e
        if not isinstance(move.observation, str):
            raise EnvFailure(f"{self.family}:{self.env_id} {what} gave a {type(move.observation).__name__} observation,"
                             " not text")
        return move
