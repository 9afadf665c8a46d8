"""A user's own TextArena game, written as TextArena's own games are (`textarena/envs/TicTacToe/env.py`): a `ta.Env`
subclass over `ta.TwoPlayerState`, moves in brackets with the open ones listed ("Available Moves: ..."), the
state's `set_invalid_move` / `set_winner`, and `ta.register(id=..., entry_point="module:Class", **kwargs)` at
import. sleuth reaches it as `textarena:textarena_user_env:TakeAway-v0`."""

import random
import re
from typing import Any

import textarena as ta


class TakeAwayEnv(ta.Env):
    def __init__(self, low: int = 8, high: int = 12, max_take: int = 3):
        super().__init__()
        self.low, self.high, self.max_take = low, high, max_take

    def reset(self, num_players: int, seed: int | None = None):
        self.state = ta.TwoPlayerState(num_players=num_players, seed=seed)
        stones = random.randint(self.low, self.high)
        self.state.reset(game_state={"stones": stones}, player_prompt_function=self._prompt)
        self._observe()

    def _prompt(self, player_id: int, game_state: dict[str, Any]) -> str:
        return (f"You are Player {player_id} in Take Away. Players take turns removing 1 to {self.max_take} stones "
                "from one pile; whoever takes the last stone wins. Write your move in brackets, e.g. '[2]'.")

    def _observe(self):
        stones = self.state.game_state["stones"]
        moves = ", ".join(f"'[{n}]'" for n in range(1, min(self.max_take, stones) + 1))
        self.state.add_observation(message=f"Stones left: {stones}\nAvailable Moves: {moves}",
                                   observation_type=ta.ObservationType.GAME_BOARD)

    def step(self, action: str) -> tuple[bool, ta.Info]:
        player_id = self.state.current_player_id
        self.state.add_observation(from_id=player_id, message=action, observation_type=ta.ObservationType.PLAYER_ACTION)
        match = re.compile(r"\[\s*(\d+)\s*\]").search(action)
        stones = self.state.game_state["stones"]
        if match is None:
            self.state.set_invalid_move(reason="The move does not follow the format '[n]'.")
        elif not 1 <= int(match.group(1)) <= min(self.max_take, stones):
            self.state.set_invalid_move(reason=f"{match.group(1)} is not a number of stones you may take.")
        else:
            self.state.game_state["stones"] = stones - int(match.group(1))
            if self.state.game_state["stones"] == 0:
                self.state.set_winner(player_id=player_id, reason=f"Player {player_id} took the last stone.")
        self._observe()
        return self.state.step()


ta.register(id="TakeAway-v0", entry_point="textarena_user_env:TakeAwayEnv", low=8, high=12, max_take=3)
