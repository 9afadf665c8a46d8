"""A step of another library's env through sleuth's family adapter (`sleuth.make("FAMILY:ID")`) against the same
env driven by its own library directly, the same episodes and actions in one run: µs per step and the ratio.
The adapter's extra work is the Env contract's (chat messages, the verdict, the seed task) plus, for GEM and
TextArena, listing the legal moves each step (GEM: 16 draws of its own `sample_random_action`)."""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from common import publish

import sleuth
from sleuth.core.machine import cpu_name
from sleuth.envs.outcome import reset_info, step_info
from sleuth.tasks import load_tasks

EPISODES, ROUNDS = 200, 5


def per_step_us(play) -> float:
    """Median over ROUNDS of (time of EPISODES episodes) / (steps taken)."""
    out = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        steps = sum(play(seed) for seed in range(EPISODES))
        out.append((time.perf_counter() - t0) / steps * 1e6)
    return statistics.median(out)


def adapter(env_id: str, action, **env_args):
    env = sleuth.make(env_id, **env_args)
    tasks = load_tasks(f"seeds:0-{EPISODES - 1}")

    def play(seed: int) -> int:
        env.reset(options={"task": tasks[seed]})
        n, done = 0, False
        while not done:
            _, _, terminated, truncated, _ = env.step(action(n))
            n, done = n + 1, terminated or truncated
        return n
    return play


def reasoning_gym_rows() -> tuple[float, float]:
    import reasoning_gym
    from reasoning_gym.utils import extract_answer

    ds = reasoning_gym.create_dataset("chain_sum", size=2_000_000, seed=0)
    reply = "<answer>42</answer>"

    def direct(seed: int) -> int:
        entry = ds[seed]
        ds.score_answer(extract_answer(reply), entry)
        return 1
    return per_step_us(direct), per_step_us(adapter("reasoning_gym:chain_sum", lambda n: reply))


def gem_rows() -> tuple[float, float]:
    import gem

    env = gem.make("game:GuessTheNumber-v0-hard")
    guess = lambda n: f"\\boxed{{{n * 7 % 50 + 1}}}"  # noqa: E731

    def direct(seed: int) -> int:
        env.reset(seed=seed)
        n, done = 0, False
        while not done:
            _, _, terminated, truncated, _ = env.step(guess(n))
            n, done = n + 1, terminated or truncated
        return n
    return per_step_us(direct), per_step_us(adapter("gem:game:GuessTheNumber-v0-hard", guess))


class InOrder:
    """Plays the lowest listed move: the same opponent for both drives."""

    def new_game(self):
        pass

    def act(self, seat, observation, legal_actions, rng):
        return sorted(legal_actions or ["[0]"])[0]


def textarena_rows() -> tuple[float, float]:
    import textarena

    from sleuth.envs.families.textarena import listed_moves, render

    env = textarena.make("TicTacToe-v0-raw")

    def direct(seed: int) -> int:  # both seats play the lowest listed move; the policy's steps are counted
        env.reset(num_players=2, seed=seed)
        n, done = 0, False
        while not done:
            player, messages = env.get_observation()
            moves = listed_moves(render(messages))
            done, _ = env.step(sorted(moves or ["[0]"])[0])
            n += player == 0
        env.close()
        return n

    made = sleuth.make("textarena:TicTacToe-v0", opponent=InOrder())
    tasks = load_tasks(f"seeds:0-{EPISODES - 1}")

    def through_sleuth(seed: int) -> int:
        _, info = made.reset(options={"task": tasks[seed]})
        legal, n, done = reset_info(info).legal_actions, 0, False
        while not done:
            _, _, terminated, truncated, info = made.step(sorted(legal or ["[0]"])[0])
            legal, n, done = step_info(info).legal_actions, n + 1, terminated or truncated
        return n
    return per_step_us(direct), per_step_us(through_sleuth)


def openenv_rows() -> tuple[float, float]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "foreign"))
    import openenv_guess

    env = openenv_guess.GuessEnvironment()
    guess = lambda n: n + 1  # noqa: E731

    def direct(seed: int) -> int:
        env.reset(seed=seed)
        n, done = 0, False
        while not done:
            done = env.step(openenv_guess.GuessAction(guess=guess(n))).done
            n += 1
        return n
    call = lambda n: json.dumps({"name": "guess", "arguments": {"guess": guess(n)}})  # noqa: E731
    return per_step_us(direct), per_step_us(adapter("openenv:openenv_guess:GuessEnvironment",
                                                    lambda n: f"<tool_call>{call(n)}</tool_call>"))


def main() -> None:
    rows = {"reasoning_gym:chain_sum": reasoning_gym_rows(), "gem:game:GuessTheNumber-v0-hard": gem_rows(),
            "textarena:TicTacToe-v0": textarena_rows(), "openenv (in process, tests/foreign guess env)": openenv_rows()}
    lines = [f"CPU: {cpu_name()}; {EPISODES} episodes × {ROUNDS} rounds, median", "",
             "| env | its library directly (µs/step) | through sleuth (µs/step) | added µs | ratio |",
             "|---|---|---|---|---|"]
    for name, (direct, ours) in rows.items():
        lines.append(f"| {name} | {direct:.1f} | {ours:.1f} | {ours - direct:+.1f} | {ours / direct:.2f} |")
    publish("family_step", "Env families: a step through sleuth's adapter vs the library directly", "\n".join(lines))


if __name__ == "__main__":
    main()
