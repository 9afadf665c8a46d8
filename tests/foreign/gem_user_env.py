"""A user's own GEM env, written as GEM's own envs are (`gem/envs/game_env/guess_the_number.py`): a `gem.Env`
subclass whose `reset(seed)` seeds through `super().reset(seed)` and draws from Python's `random`, a text action with
the guess in `\\boxed{}`, GEM's `LanguageGameReward` values, and `gem.register(id, "module:Class", **kwargs)` at
import. sleuth reaches it as `gem:gem_user_env:game:CodeLock-v0`."""

import random
import re
from typing import Any

import gem
from gem.core import Env
from gem.utils.constants import LanguageGameReward


class CodeLockEnv(Env):
    def __init__(self, digits: int = 3, max_turns: int = 6, **_):
        super().__init__()
        self.digits = digits
        self.max_turns = max_turns

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed)
        self.code = "".join(random.choice("0123456789") for _ in range(self.digits))
        self.turn_count = 0
        return (
            f"Open a lock whose code has {self.digits} digits in {self.max_turns} turns. After each guess you are "
            "told how many digits are in the right place. Put your guess inside \\boxed{}, e.g. "
            f"{self.sample_random_action()}.",
            {},
        )

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.turn_count += 1
        matches = re.findall(r"\\boxed{(\d+)}", action)
        guess = matches[-1] if matches else None
        if guess is None or len(guess) != self.digits:
            return (f"At turn {self.turn_count}, you did not provide a valid guess.",
                    LanguageGameReward.format_error_reward, True, False, {})
        if guess == self.code:
            return (f"The lock opens: the code is {self.code}.", LanguageGameReward.success_reward, True, False, {})
        right = sum(a == b for a, b in zip(guess, self.code, strict=False))
        if self.turn_count >= self.max_turns:
            return ("You have reached the maximum number of turns.", LanguageGameReward.fail_reward, True, True, {})
        return (f"At turn {self.turn_count}, {right} of the digits of {guess} are in the right place.",
                LanguageGameReward.internal_step_reward, False, False, {})

    def sample_random_action(self) -> str:
        return "\\boxed{" + "".join(random.choice("0123456789") for _ in range(self.digits)) + "}"


gem.register("game:CodeLock-v0", "gem_user_env:CodeLockEnv", digits=2, max_turns=6)
