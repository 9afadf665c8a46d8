"""A pure-Python OpenEnv env for the tests (openenv-core ships none): guess a number from 1 to `high` in `tries`
tries, told higher or lower; reward 1.0 for the right guess. The target follows the reset seed."""

from __future__ import annotations

import random
from typing import Any

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class GuessAction(Action):
    """Guess the hidden number."""

    guess: int = Field(..., description="your guess", ge=0)


class GuessObservation(Observation):
    message: str = Field(default="", description="what the game says")


class GuessEnvironment(Environment[GuessAction, GuessObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, high: int = 8, tries: int = 4):
        super().__init__()
        self.high, self.tries = high, tries
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        self.target = random.Random(seed).randint(1, self.high)
        self.left = self.tries
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(message=f"Guess a number from 1 to {self.high}; you have {self.tries} tries.")

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        if action.guess == 999:  # a bug in the env's own code, for the fault tests
            raise RuntimeError("the guess env broke")
        self._state.step_count += 1
        self.left -= 1
        if action.guess == self.target:
            return GuessObservation(message="Right!", done=True, reward=1.0)
        hint = "higher" if action.guess < self.target else "lower"
        return GuessObservation(message=f"{hint}; {self.left} tries left", done=self.left == 0, reward=0.0)

    @property
    def state(self) -> State:
        return self._state
