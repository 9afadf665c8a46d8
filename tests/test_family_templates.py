"""Envs users write for GEM, TextArena and reasoning-gym, as those libraries write their own (`tests/foreign/`: a
`gem.Env` subclass under `gem.register`, a `ta.Env` subclass under `ta.register`, a `ProceduralDataset` under
`register_dataset`), reached by naming the user's module in the id (`FAMILY:MODULE:ID`, as `openenv:MODULE:Class`),
through `sleuth.make`, the agent loop and `sleuth eval` with no other argument."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import sleuth
from sleuth.agents.loop.episodes import run_episodes
from sleuth.agents.policies.load import load_policy
from sleuth.envs.outcome import reset_info
from sleuth.envs.registry import UnknownEnvError
from sleuth.tasks import load_tasks

FOREIGN = Path(__file__).parent / "foreign"
GEM = "gem:gem_user_env:game:CodeLock-v0"
TA = "textarena:textarena_user_env:TakeAway-v0"
RG = "reasoning_gym:rg_user_dataset:digit_sum"


@pytest.fixture
def user_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's modules importable, as a user's own package or working directory makes them."""
    monkeypatch.syspath_prepend(str(FOREIGN))


def _eval(tmp_path: Path, env: str, policy: str, *extra: str) -> dict:
    """`sleuth eval --env ENV` in a fresh process, from the directory that holds the user's module, as a user runs
    it: nothing has imported the module before sleuth does."""
    out = tmp_path / "out"
    cli = Path(sys.executable).with_name("sleuth")
    done = subprocess.run([str(cli), "eval", "--env", env, "--policy", policy, *extra, "--out", str(out)],
                          cwd=FOREIGN, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads((out / "summary.json").read_text())


def test_gem_user_env_runs_as_gem_makes_it(user_modules: None) -> None:
    import gem

    env = sleuth.make(GEM)
    obs, info = env.reset(options={"task": load_tasks("seeds:7")[0]})
    mine = gem.make("game:CodeLock-v0")  # the user's id, registered by importing their module
    assert obs == mine.reset(seed=7)[0]  # the episode GEM itself makes for the seed
    assert all(m.startswith("\\boxed{") for m in reset_info(info).legal_actions)  # the env's own sample_random_action
    trajs = list(run_episodes(lambda: sleuth.make(GEM), load_tasks("seeds:0-3"), load_policy("random-legal")))
    assert len(trajs) == 4 and all(t.verdict is not None for t in trajs)
    with pytest.raises(UnknownEnvError, match="did you mean 'gem:gem_user_env:game:CodeLock-v0'"):
        sleuth.make("gem:gem_user_env:game:CodeLok-v0")


def test_gem_user_env_under_sleuth_eval(tmp_path: Path) -> None:
    s = _eval(tmp_path, GEM, "random-legal", "--limit", "3")
    assert s["n"] == 3 and s["tasks"] == "seeds:test"


def test_textarena_user_game_runs_against_the_random_legal_opponent(user_modules: None) -> None:
    env = sleuth.make(TA)
    assert env.env_args()["num_players"] == 2  # the game's TwoPlayerState takes two
    _, info = env.reset(options={"task": load_tasks("seeds:3")[0]})
    assert set(reset_info(info).legal_actions) <= {"[1]", "[2]", "[3]"} and reset_info(info).legal_actions
    trajs = list(run_episodes(lambda: sleuth.make(TA), load_tasks("seeds:0-3"), load_policy("random-legal")))
    assert all(t.verdict.details["outcome"] in ("win", "loss") for t in trajs)


def test_textarena_user_game_under_sleuth_eval(tmp_path: Path) -> None:
    s = _eval(tmp_path, TA, "random-legal", "--limit", "3")
    assert s["n"] == 3


def test_textarena_single_player_game_needs_no_player_count() -> None:
    env = sleuth.make("textarena:GuessTheNumber-v0")  # SinglePlayerState: one player, found without env_args
    assert env.env_args()["num_players"] == 1
    with pytest.raises(ValueError, match="num_players"):
        sleuth.make("textarena:GuessTheNumber-v0", num_players=2)


def test_reasoning_gym_user_dataset_scores_with_its_own_scorer(user_modules: None) -> None:
    import reasoning_gym

    env = sleuth.make(RG)
    question, _ = env.reset(options={"task": load_tasks("seeds:5")[0]})
    entry = reasoning_gym.create_dataset("digit_sum", size=2_000_000, seed=0)[5]
    assert question == entry["question"]
    assert env.step(f"<answer>{entry['answer']}</answer>")[1] == 1.0
    trajs = list(run_episodes(lambda: sleuth.make(RG), load_tasks("seeds:0-2"), load_policy("oracle")))
    assert [t.verdict.score for t in trajs] == [1.0, 1.0, 1.0]  # gold regenerated from the env's arguments


def test_reasoning_gym_user_dataset_under_sleuth_eval(tmp_path: Path) -> None:
    s = _eval(tmp_path, RG, "oracle", "--tasks", "seeds:10-12")
    assert s["n"] == 3 and s["score"] == 1.0


@pytest.mark.parametrize("size", [None, 5])
def test_a_reset_with_no_seed_or_task_stays_inside_a_finite_seed_set(user_modules: None, size: int | None) -> None:
    """reasoning-gym's seeds index `size` items: a bare reset() draws one of them (it drew up to 2**31 and failed)."""
    for env_id in ("reasoning_gym:chain_sum", RG):
        env = sleuth.make(env_id, **({"size": size} if size else {}))
        for _ in range(5):
            question, info = env.reset()
            assert question and int(info["task_id"].removeprefix("seed-")) < (size or env.seed_count())
