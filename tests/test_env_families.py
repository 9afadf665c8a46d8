"""Other libraries' envs as sleuth env families (`FAMILY:ID`): reasoning-gym, GEM, TextArena and OpenEnv, each
driven by its real library, through the Env contract, the agent loop and `sleuth eval`."""

import contextlib
import json
import threading
import time
from pathlib import Path

import pytest

import sleuth
from sleuth.agents.loop.episodes import run_episodes
from sleuth.agents.policies.load import load_policy
from sleuth.cli.main import main
from sleuth.core.net import free_port
from sleuth.envs.families import EnvFailure, MissingExtraError
from sleuth.envs.families.base import require
from sleuth.envs.outcome import reset_info, step_info
from sleuth.envs.registry import UnknownEnvError
from sleuth.tasks import LeakageError, check_tasks, held_out_specs, load_held_out, load_tasks

FOREIGN = str(Path(__file__).parent / "foreign")
SUMS = {"answer": "reply", "min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def _trajectories(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]


# -- seeds: the tasks of envs that make their own episodes ---------------------------------------------------
def test_seed_ranges_and_the_named_splits_are_disjoint():
    assert [t.payload["seed"] for t in load_tasks("seeds:3-5")] == [3, 4, 5]
    assert [t.id for t in load_tasks("seeds:7")] == ["seed-7"]
    test, dev, train = ({t.id for t in load_tasks(f"seeds:{s}")} for s in ("test", "dev", "train"))
    assert not (test & train) and not (test & dev) and not (dev & train)
    with pytest.raises(ValueError, match="seed range"):
        load_tasks("seeds:five")
    with pytest.raises(ValueError, match="ends before"):
        load_tasks("seeds:9-3")


def test_training_on_evaluation_seeds_is_refused_and_the_default_is_disjoint():
    from sleuth.training.config import load_config

    held = load_held_out(held_out_specs("seeds:0-99"))
    with pytest.raises(LeakageError):
        check_tasks(load_tasks("seeds:0-99"), held, "tasks seeds:0-99")
    cfg = load_config(overrides={"env": "reasoning_gym:chain_sum"})
    assert cfg.tasks == "seeds:train"
    check_tasks(load_tasks(cfg.tasks), load_held_out(held_out_specs(cfg.tasks)), "tasks")  # no leak
    assert load_config().tasks == "hotpotqa:train"  # sleuth's own envs keep theirs


# -- ids, extras, harnesses -----------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, hint", [("reasoning-gym:chain_sum", "'reasoning_gym'"),
                                       ("reasoning_gym:chain_summ", "reasoning_gym:chain_sum"),
                                       ("gem:game:Sudoku-v0-eazy", "gem:game:Sudoku-v0-easy"),
                                       ("textarena:TicTacTo-v0", "textarena:TicTacToe-v0")])
def test_an_unknown_family_or_id_says_did_you_mean(bad, hint):
    with pytest.raises(UnknownEnvError, match=f"did you mean.*{hint}"):
        sleuth.make(bad)


def test_a_missing_library_names_the_extra_that_installs_it():
    with pytest.raises(MissingExtraError, match=r"pip install 'sleuth\[gem\]'"):
        require("gem_llm_not_installed_here", "gem", "gem-llm")


def test_a_text_env_refuses_a_tool_call_harness_and_a_tool_env_the_free_one():
    with pytest.raises(ValueError, match="whole reply"):
        sleuth.make("gem:game:GuessTheNumber-v0-easy", harness="json")
    with pytest.raises(ValueError, match="acts through tools"):
        sleuth.make("DocRead-v0", harness="free")


# -- reasoning-gym ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dataset", ["chain_sum", "letter_counting", "spell_backward"])
def test_the_oracle_scores_one_on_reasoning_gym_datasets_with_their_own_scorer(dataset, tokenizer):
    trajs = list(run_episodes(lambda: sleuth.make(f"reasoning_gym:{dataset}"), load_tasks("seeds:0-3"),
                              load_policy("oracle"), concurrency=4))
    assert [t.verdict.score for t in trajs] == [1.0] * 4
    assert all(t.verdict.details["format_ok"] == 1.0 and len(t.turns) == 1 for t in trajs)


def test_reasoning_gym_items_follow_the_seed_and_score_as_its_library_does():
    import reasoning_gym

    env = sleuth.make("reasoning_gym:chain_sum", **SUMS)
    ds = reasoning_gym.create_dataset("chain_sum", size=2_000_000, seed=0, **{k: v for k, v in SUMS.items()
                                                                            if k != "answer"})
    question, _ = env.reset(options={"task": load_tasks("seeds:41")[0]})
    entry = ds[41]
    assert question == entry["question"]
    reply = f"{question} {entry['answer']}"
    _, reward, terminated, _, info = env.step(reply)
    assert terminated and reward == pytest.approx(ds.score_answer(reply, entry)) and 0 < reward < 1
    tags = sleuth.make("reasoning_gym:chain_sum")
    tags.reset(options={"task": load_tasks("seeds:41")[0]})
    assert tags.step(reply)[1] == 0.0  # no <answer> tags: no answer, by reasoning-gym's protocol
    with pytest.raises(ValueError, match="answer must be"):
        sleuth.make("reasoning_gym:chain_sum", answer="last")


# -- GEM ----------------------------------------------------------------------------------------------------------
def test_gem_games_play_with_random_legal_moves_that_never_change_the_game():
    env = sleuth.make("gem:game:GuessTheNumber-v0-easy")
    env.reset(options={"task": load_tasks("seeds:5")[0]})
    target = env.env.game_number
    for _ in range(3):
        env._legal()  # drawing the listed moves leaves the game's generators where they were
    env.reset(options={"task": load_tasks("seeds:5")[0]})
    assert env.env.game_number == target
    trajs = list(run_episodes(lambda: sleuth.make("gem:game:GuessTheNumber-v0-easy"), load_tasks("seeds:0-5"),
                              load_policy("random-legal"), concurrency=3))
    assert all(t.verdict is not None and not t.failed for t in trajs)
    assert all(t.turns[0].action_text.startswith("\\boxed{") for t in trajs)
    assert any(t.verdict.score == 1.0 for t in trajs)  # the easy game: some random guesses win


def test_gem_envs_that_would_download_are_refused_in_one_line():
    with pytest.raises(RuntimeError, match="Hugging Face hub; nothing downloads"):
        sleuth.make("gem:math:GSM8K")


# -- TextArena -----------------------------------------------------------------------------------------------------
def test_textarena_random_legal_plays_listed_moves_against_a_random_legal_opponent():
    trajs = list(run_episodes(lambda: sleuth.make("textarena:TicTacToe-v0"), load_tasks("seeds:0-5"),
                              load_policy("random-legal"), concurrency=3))
    outcomes = {t.verdict.details["outcome"] for t in trajs}
    assert outcomes <= {"win", "loss", "draw"} and len(outcomes) > 1
    assert all(t.verdict.details["invalid_move"] == 0.0 for t in trajs)
    for t in trajs:
        assert t.verdict.score == {"win": 1.0, "loss": -1.0, "draw": 0.0}[t.verdict.details["outcome"]]


def test_rule_breaking_is_judged_by_the_game_for_the_policy_and_the_opponent():
    env = sleuth.make("textarena:TicTacToe-v0")
    env.reset(options={"task": load_tasks("seeds:1")[0]})
    env.step("I'd rather not")  # TextArena warns once ...
    _, reward, terminated, _, info = env.step("still no")  # ... then the offender loses
    assert terminated and reward == -1.0
    details = step_info(info).verdict.details
    assert details["invalid_move"] == 1.0 and details["outcome"] == "loss"

    class Vandal:
        def new_game(self):
            pass

        def act(self, seat, observation, legal_actions, rng):
            return "no move at all"

    env = sleuth.make("textarena:TicTacToe-v0", opponent=Vandal())
    env.reset(options={"task": load_tasks("seeds:1")[0]})
    _, reward, done, _, info = env.step("[4]")  # the opponent's two illegal replies to it lose the game
    assert done and reward == 1.0 and step_info(info).verdict.details["outcome"] == "win"


def test_a_model_opponent_plays_its_seat_through_an_openai_server_and_its_death_fails_the_episode(tiny_model_dir):
    """The opponent is a real model behind `sleuth serve gateway`: it sees the game's messages to its seat as a
    chat, its moves reach the game, and killing the server mid-game is an env failure, never a score."""
    import os
    import signal

    from sleuth.core.net import subprocess_server

    with subprocess_server(["gateway", "--policy", tiny_model_dir]) as (url, proc):
        env = sleuth.make("textarena:TicTacToe-v0", opponent={"url": f"{url}/v1", "max_tokens": 8})
        assert env.env_args()["opponent"] == {"url": f"{url}/v1", "max_tokens": 8}
        env.reset(options={"task": load_tasks("seeds:0")[0]})
        obs, _, done, _, _ = env.step("[4]")  # seat 1, the model, answers
        chat = env.opponent.chats[1]
        assert [m["role"] for m in chat] == ["user", "assistant"] * (len(chat) // 2) and "[4]" in chat[0]["content"]
        assert chat[1]["content"].strip() in chat[2]["content"] if len(chat) > 2 else not done  # its move, refused
        # (the random tiny model's reply is no move: TextArena warns once, quoting it, then the offender loses)
        env.reset(options={"task": load_tasks("seeds:1")[0]})
        assert env.opponent.chats == {}  # a new game, a new chat
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        with pytest.raises(EnvFailure, match="raised in step"):
            env.step("[0]")
    with pytest.raises(ValueError, match="does not list its models"):
        sleuth.make("textarena:TicTacToe-v0", opponent=url + "/v1")


def test_textarena_player_counts_and_unknown_opponents_are_refused():
    with pytest.raises(ValueError, match="num_players"):
        sleuth.make("textarena:TicTacToe-v0", num_players=3, seat=0)
    with pytest.raises(ValueError, match="unknown opponent"):
        sleuth.make("textarena:TicTacToe-v0", opponent="grandmaster")
    with pytest.raises(ValueError, match="rollout.inference: vllm"):
        sleuth.make("textarena:TicTacToe-v0", opponent="self")
    with pytest.raises(ValueError, match="got keys"):
        sleuth.make("textarena:TicTacToe-v0", opponent={"model": "x"})


# -- OpenEnv --------------------------------------------------------------------------------------------------------
GUESS = "openenv:openenv_guess:GuessEnvironment"


def _call(guess) -> str:
    return f'<tool_call>{{"name": "guess", "arguments": {{"guess": {json.dumps(guess)}}}}}</tool_call>'


def test_an_openenv_action_model_becomes_a_tool_and_malformed_calls_are_observations(monkeypatch):
    monkeypatch.syspath_prepend(FOREIGN)
    env = sleuth.make(GUESS)
    _, info = env.reset(options={"task": load_tasks("seeds:5")[0]})
    assert [t["function"]["name"] for t in reset_info(info).tools] == ["guess"] and reset_info(info).format == "json"
    params = reset_info(info).tools[0]["function"]["parameters"]
    assert params["required"] == ["guess"] and "metadata" not in params["properties"]
    target = env.env.target
    for action, error in [("guess 3", "no tool call"), (_call(-3), "refused"), (_call("x"), "must be integer"),
                          ('<tool_call>{"name": "gues", "arguments": {"guess": 2}}</tool_call>', "unknown tool")]:
        obs, reward, terminated, _, info = env.step(action)
        assert error in step_info(info).error and not terminated and reward == 0.0
    obs, reward, terminated, _, info = env.step(_call(target))
    assert terminated and reward == 1.0 and step_info(info).verdict.score == 1.0 and step_info(info).error is None


def test_an_env_that_raises_in_step_fails_the_episode_and_is_never_scored(monkeypatch, tokenizer):
    from sleuth.agents.policies.base import Generation

    monkeypatch.syspath_prepend(FOREIGN)

    class Breaks:
        name, version, max_context, parallel_calls, tokenizer = "breaks", 0, None, 1, None

        def generate(self, requests, sampling):
            text = _call(999)
            ids = tokenizer.encode(text) + [tokenizer.eos_token_id]
            return [Generation(ids, [0.0] * len(ids), text) for _ in requests]

    Breaks.tokenizer = tokenizer
    trajs = list(run_episodes(lambda: sleuth.make(GUESS), load_tasks("seeds:0-1"), Breaks(), concurrency=2))
    assert all(t.failed and t.stop_reason == "env_error" and "EnvFailure" in t.error for t in trajs)
    assert all(t.verdict is None for t in trajs)
    with pytest.raises(EnvFailure, match="raised in step"):
        env = sleuth.make(GUESS)
        env.reset(seed=0)
        env.step(_call(999))


def test_a_running_openenv_server_plays_through_openenv_cores_own_client(monkeypatch, tmp_path):
    from openenv.core.env_server.http_server import create_fastapi_app

    monkeypatch.syspath_prepend(FOREIGN)
    import openenv_guess

    app = create_fastapi_app(openenv_guess.GuessEnvironment, openenv_guess.GuessAction,
                             openenv_guess.GuessObservation, max_concurrent_envs=4)
    with _served(app) as port:
        url = f"openenv:http://127.0.0.1:{port}"
        env = sleuth.make(url)
        env.reset(options={"task": load_tasks("seeds:5")[0]})
        local = sleuth.make(GUESS)
        local.reset(seed=5)
        target = local.env.target
        assert "higher" in env.step(_call(0))[0]
        assert env.step(_call(target))[1] == 1.0
        env.close()
        assert main(["eval", "--env", url, "--policy", "oracle", "--limit", "2", "--out", str(tmp_path / "o")]) == 2


@contextlib.contextmanager
def _served(app):
    """`app` on a uvicorn server in a thread of this process; yields its port."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(100):
            if server.started:
                break
            time.sleep(0.05)
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=10)


MCP_CALC = "openenv:openenv_mcp_calc:CalcEnvironment"


def _mcp_call(name: str, **args) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


def _play_calc(env, a: int, b: int) -> None:
    """add (a bad call first), then submit: each tool under its own name and schema, a failure an observation."""
    obs, reward, terminated, _, info = env.step(_mcp_call("add", a="x", b=b))
    assert "must be integer" in step_info(info).error and not terminated
    obs, reward, terminated, _, info = env.step(_mcp_call("mul", a=a, b=b))
    assert "unknown tool" in step_info(info).error and not terminated
    obs, reward, terminated, _, _ = env.step(_mcp_call("add", a=a, b=b))
    assert obs.strip().endswith(str(a + b)) and reward == 0.0 and not terminated
    obs, reward, terminated, _, info = env.step(_mcp_call("submit", answer=a + b))
    assert terminated and reward == 1.0 and step_info(info).verdict.score == 1.0


def test_an_openenv_mcp_env_offers_its_mcp_tools(monkeypatch):
    monkeypatch.syspath_prepend(FOREIGN)
    env = sleuth.make(MCP_CALC)
    obs, info = env.reset(options={"task": load_tasks("seeds:5")[0]})
    assert "Use the tools" in obs and [t["function"]["name"] for t in reset_info(info).tools] == ["add", "submit"]
    assert reset_info(info).tools[0]["function"]["parameters"]["required"] == ["a", "b"]
    _play_calc(env, env.env.a, env.env.b)


def test_an_openenv_mcp_server_offers_its_tools_through_openenv_cores_client(monkeypatch):
    from openenv.core.env_server.http_server import create_fastapi_app
    from openenv.core.env_server.mcp_types import CallToolAction

    monkeypatch.syspath_prepend(FOREIGN)
    import openenv_mcp_calc

    app = create_fastapi_app(openenv_mcp_calc.CalcEnvironment, CallToolAction, openenv_mcp_calc.CalcObservation,
                             max_concurrent_envs=2)
    with _served(app) as port:
        env = sleuth.make(f"openenv:http://127.0.0.1:{port}")
        obs, info = env.reset(options={"task": load_tasks("seeds:5")[0]})
        assert [t["function"]["name"] for t in reset_info(info).tools] == ["add", "submit"]
        local = sleuth.make(MCP_CALC)
        local.reset(seed=5)
        _play_calc(env, local.env.a, local.env.b)
        env.close()


# -- sleuth eval and sleuth train ------------------------------------------------------------------------------------
def test_sleuth_eval_plays_seeds_without_a_task_file(tmp_path, capsys):
    out = tmp_path / "gem"
    assert main(["eval", "--env", "gem:game:GuessTheNumber-v0-easy", "--policy", "random-legal", "--limit", "3",
                 "--out", str(out)]) == 0
    s = _summary(out)
    assert s["n"] == 3 and s["tasks"] == "seeds:test" and s["harness"] == "free"
    assert [t["task_id"] for t in _trajectories(out)] == ["seed-0", "seed-1", "seed-2"] or \
        sorted(t["task_id"] for t in _trajectories(out)) == ["seed-0", "seed-1", "seed-2"]
    assert main(["eval", "--env", "reasoning_gym:chain_sum", "--policy", "oracle", "--tasks", "seeds:10-13",
                 "--out", str(tmp_path / "rg")]) == 0
    assert _summary(tmp_path / "rg")["score"] == 1.0
    capsys.readouterr()
    assert main(["eval", "--env", "DocRead-v0", "--policy", "oracle", "--out", str(tmp_path / "x")]) == 2
    assert "--tasks is required" in capsys.readouterr().err


def test_a_model_plays_each_family_under_sleuth_eval(tiny_model_dir, tmp_path, monkeypatch):
    """A transformers policy (the tiny random model: the plumbing, not the play, is checked, and SmolLM2's weights
    would only make it slower) plays each family under `sleuth eval`: its sampled ids reach every turn."""
    monkeypatch.syspath_prepend(FOREIGN)
    cut = ["--env-arg", "max_turns=2"]  # the test is the plumbing, not the game: two turns at most
    for env, extra in [("reasoning_gym:chain_sum", []), ("gem:game:GuessTheNumber-v0-easy", cut),
                       ("textarena:TicTacToe-v0", cut), (GUESS, cut)]:
        out = tmp_path / env.replace(":", "_")
        assert main(["eval", "--env", env, *extra, "--policy", tiny_model_dir, "--limit", "2", "--max-tokens", "16",
                     "--out", str(out)]) == 0
        assert _summary(out)["n"] == 2
        for t in _trajectories(out):  # token-in/token-out: every action's ids are what the model sampled
            assert all(turn["action_ids"] and len(turn["action_ids"]) == len(turn["action_logprobs"])
                       for turn in t["turns"])


@pytest.mark.slow
def test_grpo_trains_two_steps_on_a_reasoning_gym_and_a_textarena_env(tiny_model_dir, tmp_path):
    from sleuth.training.config import load_config
    from sleuth.training.rl.trainer import Trainer

    for env, args in [("reasoning_gym:chain_sum", SUMS), ("textarena:TicTacToe-v0", {"max_turns": 3})]:
        cfg = load_config(overrides={"model": tiny_model_dir, "env": env, "env_args": args, "max_steps": 2,
                                     "out": str(tmp_path / env.replace(":", "_")), "rollout.group_size": 2,
                                     "rollout.tasks_per_step": 2, "rollout.max_tokens": 8,
                                     "rollout.temperature": 1.0, "deepspeed.zero_stage": 0,
                                     "checkpoint.every": 100})
        assert cfg.tasks == "seeds:train"
        rows = Trainer(cfg, progress=False).train()
        assert len(rows) == 2 and all(r["episodes/sampled"] == 4 for r in rows)


def test_a_family_env_served_by_sleuth_serve_env_keeps_its_legal_moves():
    from sleuth.core.net import in_thread
    from sleuth.servers.env import create_app

    with in_thread(create_app("gem:game:GuessTheNumber-v0-easy")) as url:
        trajs = list(run_episodes(lambda: sleuth.make("Remote-v0", url=url), load_tasks("seeds:0-2"),
                                  load_policy("random-legal"), concurrency=3))
    local = list(run_episodes(lambda: sleuth.make("gem:game:GuessTheNumber-v0-easy"), load_tasks("seeds:0-2"),
                              load_policy("random-legal"), concurrency=3))
    key = lambda t: t.task_id  # noqa: E731
    assert [(t.task_id, t.verdict.score, [u.action_text for u in t.turns]) for t in sorted(trajs, key=key)] == \
        [(t.task_id, t.verdict.score, [u.action_text for u in t.turns]) for t in sorted(local, key=key)]
