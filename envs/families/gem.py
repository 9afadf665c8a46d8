"""`gem:<GEM env id>` (e.g. `gem:game:Sudoku-v0-easy`): a GEM env (`gem-llm`) through the Env contract. GEM's envs
take a text action and return the Gym 5-tuple; their rewards are kept as they are (a game's success 1.0, a
format error −0.1 that ends it), so the score is the episode's return.

A user's own env, a `gem.Env` subclass registered with `gem.register(id, "module:Class", **kwargs)` when its module
is imported (as GEM's own envs are), is `gem:<module>:<id>` (e.g. `gem:my_games:game:Mastermind-v1`): sleuth
imports the module, then makes the id. An id GEM already knows is taken as it is.

Seeding: GEM draws from Python's and NumPy's global generators, seeded at reset (`gem.utils.seeding.set_seed`).
So that an episode is fixed by its seed whatever else runs (other GEM envs in other threads, sleuth's own
draws), each env keeps its own copy of both generators' state: a call into GEM runs under one process-wide lock
with the env's state put in place, and takes it back out after. The legal moves offered to the `random-legal`
baseline are drawn from a copy that is then thrown away, so listing them never changes the game.

Nothing downloads at run time: an env that would fetch a data set from the hub (GEM's math, QA and code envs
name one in `dataset_name`) or NLTK data it lacks (Wordle, Hangman) is refused in one line before it starts;
pass a local `dataset_name` in env_args for the former."""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from sleuth.core.errors import InfraFailure
from sleuth.envs.families.base import LegalMoves, Move, TextGameEnv, registered, require
from sleuth.tasks.base import Task

LEGAL_SAMPLES = 16  # random actions drawn to list as legal moves (deduplicated)


class DownloadRefused(InfraFailure):
    """A foreign env would download data at run time."""


def env_ids() -> list[str]:
    return sorted(require("gem", "gem", "gem-llm").envs.registration.ENV_REGISTRY)


@contextlib.contextmanager
def _no_downloads(env_id: str) -> Iterator[None]:
    """Turn an NLTK download during the env's construction into `DownloadRefused` (one line, nothing fetched)."""
    import nltk

    def refuse(info_or_id: Any = None, *args: Any, **kwargs: Any) -> bool:
        try:
            nltk.data.find(f"corpora/{info_or_id}")
            return True  # already on disk: nothing to fetch
        except LookupError:
            raise DownloadRefused(f"gem:{env_id} downloads the NLTK data {info_or_id!r} when it starts; nothing "
                                  "downloads at run time here: install it first (python -m nltk.downloader "
                                  f"{info_or_id}) where a network is reachable") from None

    real, nltk.download = nltk.download, refuse
    try:
        yield
    finally:
        nltk.download = real


_GLOBAL_RNG = threading.Lock()  # GEM's generators are the process's: one env's call at a time


class _OwnRng:
    """An env's own copy of Python's and NumPy's global generator states."""

    def __init__(self) -> None:
        self.state: tuple[Any, Any] | None = None

    @contextlib.contextmanager
    def active(self, keep: bool = True) -> Iterator[None]:
        """Run with this env's state in the global generators (`keep`: save what the call leaves there)."""
        with _GLOBAL_RNG:
            outside = random.getstate(), np.random.get_state()
            if self.state is not None:
                random.setstate(self.state[0])
                np.random.set_state(self.state[1])
            try:
                yield
            finally:
                if keep:
                    self.state = random.getstate(), np.random.get_state()
                random.setstate(outside[0])
                np.random.set_state(outside[1])


class GemEnv(TextGameEnv):
    family = "gem"

    def __init__(self, env_id: str, **kwargs: Any):
        gem = require("gem", "gem", "gem-llm")
        own = {k: kwargs.pop(k) for k in ("harness", "max_turns", "system_prompt", "tasks") if k in kwargs}
        super().__init__(env_id, **own)
        registry = gem.envs.registration.ENV_REGISTRY
        gem_id = registered(env_id, registry)
        spec = registry[gem_id]
        dataset = kwargs.get("dataset_name", spec.kwargs.get("dataset_name"))
        if isinstance(dataset, str) and dataset and not Path(dataset).exists():
            raise DownloadRefused(f"gem:{env_id} loads the data set {dataset!r} from the Hugging Face hub; nothing "
                                  "downloads at run time here: pass env_args dataset_name=<a local copy>")
        self.kwargs = kwargs
        self.rng = _OwnRng()
        with _no_downloads(env_id), self.rng.active():
            self.env = gem.make(gem_id, **kwargs)

    def env_args(self) -> dict[str, Any]:
        return dict(self.kwargs)

    def begin(self, task: Task, seed: int) -> Move:
        with self.rng.active():
            obs, _ = self.env.reset(seed=seed)
        return Move(obs, legal_actions=LegalMoves(self._legal))

    def advance(self, action: str) -> Move:
        with self.rng.active():
            obs, reward, terminated, truncated, _ = self.env.step(action)
        return Move(obs, float(reward), bool(terminated), bool(truncated),
                    None if terminated or truncated else LegalMoves(self._legal))

    def _legal(self) -> list[str] | None:
        """Moves GEM's own `sample_random_action` offers now (None where the env implements none)."""
        with self.rng.active(keep=False):
            try:
                moves = [self.env.sample_random_action() for _ in range(LEGAL_SAMPLES)]
            except NotImplementedError:
                return None
        return list(dict.fromkeys(m for m in moves if isinstance(m, str)))

    def close(self) -> None:
        close = getattr(self.env, "close", None)  # GEM's Env declares no close; some of its envs define one
        if callable(close):
            close()


def make(env_id: str, **env_args: Any) -> GemEnv:
    return GemEnv(env_id, **env_args)
