"""`gem:<GEM env id>` (e.g. `gem:game:Sudoku-v0-easy`): a GEM env (`gem-llm`) through the Env contract. GEM's envs
take a text action and return the Gym 5-tuple; their rewards are kept as they are (a game's success 1.0, a
format error −0.1 that ends it), so the score is the episode's return.

Seeding: GEM seeds Python's and NumPy's global generators at reset (`gem.utils.seeding.set_seed`), so an
episode is fixed by its seed only while nothing else draws from them between steps; the legal moves offered
to the `random-legal` baseline are drawn with those generators saved and restored around the draw, so
listing them never changes the game.

Nothing downloads at run time: an env that would fetch a data set from the hub (GEM's math, QA and code envs
name one in `dataset_name`) or NLTK data it lacks (Wordle, Hangman) is refused in one line before it starts;
pass a local `dataset_name` in env_args for the former."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from sleuth.envs.families.base import Move, TextGameEnv, require
from sleuth.tasks.base import Task

LEGAL_SAMPLES = 16  # random actions drawn to list as legal moves (deduplicated)


class DownloadRefused(RuntimeError):
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


@contextlib.contextmanager
def _rng_kept() -> Iterator[None]:
    py, npy = random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)


class GemEnv(TextGameEnv):
    family = "gem"

    def __init__(self, env_id: str, **kwargs: Any):
        gem = require("gem", "gem", "gem-llm")
        own = {k: kwargs.pop(k) for k in ("harness", "max_turns", "system_prompt", "tasks") if k in kwargs}
        super().__init__(env_id, **own)
        spec = gem.envs.registration.ENV_REGISTRY[env_id]
        dataset = kwargs.get("dataset_name", spec.kwargs.get("dataset_name"))
        if isinstance(dataset, str) and dataset and not Path(dataset).exists():
            raise DownloadRefused(f"gem:{env_id} loads the data set {dataset!r} from the Hugging Face hub; nothing "
                                  "downloads at run time here: pass env_args dataset_name=<a local copy>")
        self.kwargs = kwargs
        with _no_downloads(env_id):
            self.env = gem.make(env_id, **kwargs)

    def env_args(self) -> dict[str, Any]:
        return dict(self.kwargs)

    def begin(self, task: Task, seed: int) -> Move:
        obs, _ = self.env.reset(seed=seed)
        return Move(obs, legal_actions=self._legal())

    def advance(self, action: str) -> Move:
        obs, reward, terminated, truncated, _ = self.env.step(action)
        return Move(obs, float(reward), bool(terminated), bool(truncated),
                    None if terminated or truncated else self._legal())

    def _legal(self) -> list[str] | None:
        """Moves GEM's own `sample_random_action` offers now (None where the env implements none)."""
        with _rng_kept():
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
