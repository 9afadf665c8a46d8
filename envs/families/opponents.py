"""Who plays the seats of a multi-player game that the policy does not: the `opponent:` of `textarena:` envs.

- `random-legal`: a listed move at random (seeded by the episode); where the game lists none, a bracketed token
  of its observation, which the game may refuse by its own rules.
- a model: `{url: http://HOST:PORT/v1, model: NAME, temperature: 0.0, max_tokens: 64}` (or the URL alone), any
  OpenAI-compatible chat-completions server — `sleuth serve gateway --policy CHECKPOINT`, vLLM, a hosted API. Each
  seat it plays keeps its own chat of the game, as the policy does: the game's messages to that seat as user
  turns, its own moves as the assistant's. Greedy by default, so a fixed model is a fixed opponent.
- `self`: the policy being trained, resolved by the trainer to its own rollout servers (`rollout.inference: vllm`),
  so the opponent plays with the weights of the latest sync; only the policy's seat is trained.
- any object with `new_game()` and `act(seat, observation, legal_actions, rng) -> str` (`Opponent`), in code.

A model opponent that cannot be reached fails the episode as an env failure (never a score); one that answers
with an illegal move loses by the game's rules, as the policy would."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

SELF = "self"  # the trainer replaces it with its rollout servers' URL
_MOVE = re.compile(r"\[[^\[\]\n]{1,40}\]")


class Opponent(Protocol):
    def new_game(self) -> None:
        """Forget the last game (a model's chats)."""

    def act(self, seat: int, observation: str, legal_actions: Sequence[str] | None, rng: random.Random) -> str:
        """The move of `seat`, given the game's messages to it since its last move."""


def bracketed(text: str) -> list[str]:
    return _MOVE.findall(text)


class RandomLegal:
    """A listed move at random; where the game lists none, any bracketed token of the observation."""

    def new_game(self) -> None:
        pass

    def act(self, seat: int, observation: str, legal_actions: Sequence[str] | None, rng: random.Random) -> str:
        options = legal_actions or bracketed(observation)
        return rng.choice(options) if options else ""


@dataclass(frozen=True)
class ModelSpec:
    url: str
    model: str | None = None  # None: the server's first listed model
    temperature: float = 0.0
    max_tokens: int = 64
    timeout_s: float = 120.0


class ModelOpponent:
    """A model behind an OpenAI chat-completions endpoint. httpx rather than the `openai` SDK: the SDK is an optional
    extra of sleuth's and this is one POST per move."""

    def __init__(self, spec: ModelSpec):
        self.spec = spec
        self.http = httpx.Client(base_url=spec.url.rstrip("/"), timeout=spec.timeout_s)
        try:
            models = self.http.get("/models")
            models.raise_for_status()
            listed = [m["id"] for m in models.json()["data"]]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
            self.http.close()
            raise ValueError(f"opponent server {spec.url} does not list its models at {spec.url}/models "
                             f"({type(e).__name__}: {e}): is it an OpenAI-compatible server, and running?") from None
        if spec.model is not None and spec.model not in listed:
            self.http.close()
            raise ValueError(f"opponent server {spec.url} serves {listed}, not {spec.model!r}")
        self.model = spec.model or listed[0]
        self.chats: dict[int, list[dict[str, str]]] = {}

    def new_game(self) -> None:
        self.chats = {}

    def act(self, seat: int, observation: str, legal_actions: Sequence[str] | None, rng: random.Random) -> str:
        chat = self.chats.setdefault(seat, [])
        chat.append({"role": "user", "content": observation})
        resp = self.http.post("/chat/completions", json={
            "model": self.model, "messages": chat, "temperature": self.spec.temperature,
            "max_tokens": self.spec.max_tokens})
        resp.raise_for_status()  # the env turns any failure here into an env failure of the episode
        reply = resp.json()["choices"][0]["message"]["content"] or ""
        chat.append({"role": "assistant", "content": reply})
        return reply

    def close(self) -> None:
        self.http.close()


def make_opponent(spec: str | dict[str, Any] | Opponent) -> Opponent:
    """`random-legal`, a URL, `{url: ..., model: ..., ...}`, or an `Opponent` object."""
    if isinstance(spec, str):
        if spec == "random-legal":
            return RandomLegal()
        if spec.startswith(("http://", "https://")):
            return ModelOpponent(ModelSpec(spec))
        if spec == SELF:
            raise ValueError("opponent: self is the policy being trained; only `sleuth train` with rollout.inference: "
                             "vllm can serve it (its rollout servers). To play a fixed checkpoint, serve it with "
                             "`sleuth serve gateway --policy CHECKPOINT` and pass opponent: {url: http://HOST:PORT/v1}")
        raise ValueError(f"unknown opponent {spec!r}: random-legal, self, an OpenAI-compatible URL "
                         "(http://HOST:PORT/v1), {url: ..., model: ...}, or an object with new_game() and "
                         "act(seat, observation, legal_actions, rng) passed in code")
    if isinstance(spec, dict):
        unknown = set(spec) - set(ModelSpec.__dataclass_fields__)
        if "url" not in spec or unknown:
            raise ValueError(f"a model opponent is {{url: ..., model: ..., temperature: ..., max_tokens: ..., "
                             f"timeout_s: ...}}; got keys {sorted(spec)}")
        return ModelOpponent(ModelSpec(**spec))
    return spec
