"""`textarena:<env id>` (e.g. `textarena:TicTacToe-v0`): a TextArena game with the policy in one seat (`seat`,
default 0) and an opponent in every other (`opponent`, default `random-legal`). The policy sees the game's
messages since its last move (one user message per turn; the chat history holds the rest, as TextArena's own
observation wrapper concatenates them), the opponent's moves among them. The score is the game's reward for
the policy's seat at its end (win 1, draw 0, loss −1 in two-player games): rule breaking is the game's to
judge, the policy's and the opponent's alike (TextArena warns once, then the offender loses).

Legal moves: TextArena games write moves in brackets and most list the ones open now ("Available Moves:
'[0]', '[4]'"); the last line of an observation that names moves or actions and holds bracketed moves is
read as that list. Opponents (`random-legal`, a model behind an OpenAI-compatible server, the policy itself,
an object in code) are in `opponents.py`. `num_players` (default: the first of 2, 1, 3, 4 the game takes).

A user's own game, a `ta.Env` subclass registered with `ta.register(id=..., entry_point=...)` when its module is
imported (as TextArena's own games are), is `textarena:<module>:<id>`: sleuth imports the module, then makes the id.
Where the user registered `<id>-raw` too (TextArena's `register_with_versions` does), that unwrapped version runs."""

from __future__ import annotations

import random
import re
from typing import Any

from sleuth.envs.families.base import LegalMoves, Move, TextGameEnv, registered, require
from sleuth.envs.families.opponents import ModelOpponent, Opponent, bracketed, make_opponent
from sleuth.tasks.base import Task
from sleuth.verifiers.base import Verdict

GAME_ID = -1  # TextArena's sender id of game messages
PLAYER_COUNTS = (2, 1, 3, 4)  # tried in turn where env_args name no num_players: most games take two, some one
_LISTING = re.compile(r"\b(moves?|actions?)\b", re.I)


def env_ids() -> list[str]:
    return sorted(require("textarena", "textarena", "textarena").envs.registration.ENV_REGISTRY)


def listed_moves(text: str) -> list[str] | None:
    """The moves the last line naming moves or actions lists in brackets (None if no line does)."""
    for line in reversed(text.splitlines()):
        if _LISTING.search(line):
            moves = [m for m in bracketed(line) if m.strip("[] ")]
            if moves:
                return list(dict.fromkeys(moves))
    return None


def render(messages: list[Any]) -> str:
    """TextArena's raw observation (sender, text, kind) triples as the lines its own wrapper writes."""
    if isinstance(messages, str):  # an id with TextArena's own observation wrapper
        return messages
    lines = []
    for sender, text, *_ in messages:
        who = "GAME" if sender == GAME_ID else f"Player {sender}"
        lines.append(f"[{who}] {text.strip()}")
    return "\n".join(lines)


class TextArenaEnv(TextGameEnv):
    family = "textarena"

    def __init__(self, env_id: str, *, num_players: int | None = None, seat: int = 0,
                 opponent: str | dict[str, Any] | Opponent = "random-legal", **kwargs: Any):
        ta = require("textarena", "textarena", "textarena")
        own = {k: kwargs.pop(k) for k in ("harness", "max_turns", "system_prompt", "tasks") if k in kwargs}
        super().__init__(env_id, **own)
        self.opponent: Opponent = make_opponent(opponent)
        self.rebuild = {"opponent": opponent} if isinstance(opponent, (str, dict)) else {}  # an object stays in code
        self.seat, self.kwargs = seat, kwargs
        registry = ta.envs.registration.ENV_REGISTRY
        ta_id = registered(env_id, registry)
        raw = f"{ta_id}-raw"  # the game without TextArena's wrappers: sleuth's chat history holds the messages
        self.game = ta.make(raw if raw in registry else ta_id, **kwargs)
        self.num_players = self._players(num_players)
        if not 0 <= seat < self.num_players:
            raise ValueError(f"seat {seat} is not one of the game's {self.num_players} seats")

    def _players(self, asked: int | None) -> int:
        """The player count: `asked`, else the first of PLAYER_COUNTS the game takes. TextArena declares a game's
        count nowhere but in its state's assertion at reset (`SinglePlayerState` asserts 1, `TwoPlayerState` 2)."""
        errors = []
        for n in (asked,) if asked is not None else PLAYER_COUNTS:
            try:
                self.game.reset(num_players=n, seed=0)
                return n
            except AssertionError as e:  # TextArena's states assert their player count
                errors.append(f"{n}: {e}")
        tried = f"{asked} players" if asked is not None else f"{', '.join(map(str, PLAYER_COUNTS))} players"
        raise ValueError(f"textarena:{self.env_id} does not take {tried} ({'; '.join(errors)}): pass env_args "
                         "num_players=N")

    def env_args(self) -> dict[str, Any]:
        return {"num_players": self.num_players, "seat": self.seat, **self.rebuild, **self.kwargs}

    def begin(self, task: Task, seed: int) -> Move:
        self.rng = random.Random(seed)
        self.rewards: dict[int, float] | None = None
        self.game.reset(num_players=self.num_players, seed=seed)
        self.opponent.new_game()
        return self._until_our_turn()

    def advance(self, action: str) -> Move:
        done, _ = self.game.step(action)
        return self._finish() if done else self._until_our_turn()

    def _until_our_turn(self) -> Move:
        """Let the other seats move until it is the policy's turn (or the game ends)."""
        while True:
            player, messages = self.game.get_observation()
            text = render(messages)
            if player == self.seat:
                return Move(text, legal_actions=LegalMoves(lambda t=text: listed_moves(t)))
            move = self.opponent.act(player, text, LegalMoves(lambda t=text: listed_moves(t)), self.rng)
            done, _ = self.game.step(move)
            if done:
                return self._finish()

    def _finish(self) -> Move:
        rewards, game_info = self.game.close()
        self.rewards = {int(k): float(v) for k, v in (rewards or {}).items()}
        self.info = dict((game_info or {}).get(self.seat, {}))
        return Move("", reward=self.rewards.get(self.seat, 0.0), terminated=True)

    def close(self) -> None:
        if isinstance(self.opponent, ModelOpponent):
            self.opponent.close()
        super().close()

    def verdict(self) -> Verdict:
        if self.rewards is None:  # cut off by max_turns before the game ended: no result
            return Verdict(0.0, {"outcome": "unfinished", "turns": self.turn})
        mine = self.rewards.get(self.seat, 0.0)
        best = max(self.rewards.values(), default=0.0)
        outcome = "draw" if all(v == mine for v in self.rewards.values()) else ("win" if mine == best else "loss")
        return Verdict(mine, {"outcome": outcome, "win": float(outcome == "win"), "turns": self.turn,
                              "invalid_move": float(bool(self.info.get("invalid_move"))),
                              "reason": str(self.info.get("reason", ""))})


def make(env_id: str, **env_args: Any) -> TextArenaEnv:
    return TextArenaEnv(env_id, **env_args)
