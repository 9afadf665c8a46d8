"""An OpenEnv env as its authors write it: scaffolded by OpenEnv's own `openenv init` (no generic parameters,
`reset(self)` without a seed) and served by the scaffold's own `server/app.py` (`create_app(...)`'s default of
one session at a time). Eight episodes at once wait for that one session; a policy that never makes a valid call
ends each episode at `max_invalid_actions`, scored, with its own stop reason."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import sleuth
from sleuth.agents.eval.episodes import evaluate_env
from sleuth.agents.loop.episodes import run_episodes
from sleuth.agents.policies.base import Generation
from sleuth.core.net import free_port, retry_counts, wait_healthy
from sleuth.envs.families.base import MAX_INVALID_ACTIONS
from sleuth.envs.outcome import reset_info, step_info
from sleuth.tasks import load_tasks

pytest.importorskip("openenv.core")
NAME = "echo_env"


@pytest.fixture(scope="module")
def scaffold(tmp_path_factory) -> Path:
    """`openenv init echo_env`, run as a user runs it: the package OpenEnv's template writes."""
    root = tmp_path_factory.mktemp("openenv_init")
    cli = Path(sys.executable).with_name("openenv")
    subprocess.run([str(cli), "init", NAME], cwd=root, check=True, capture_output=True, timeout=120)
    assert (root / NAME / "server" / "app.py").exists()
    return root


@pytest.fixture(scope="module")
def served(scaffold) -> str:
    """The scaffold's own server module under uvicorn, unchanged: one session at a time."""
    assert "max_concurrent_envs=1" in (scaffold / NAME / "server" / "app.py").read_text()
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", f"{NAME}.server.app:app", "--port", str(port),
                             "--log-level", "error"], cwd=scaffold)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", timeout_s=120, proc=proc)
        yield f"openenv:http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


class Writes:
    """A policy that replies `text` every turn (what is under test is the env and the loop, not the model)."""

    name, version, parallel_calls, max_context = "writes", 0, 1, None

    def __init__(self, tokenizer, text: str):
        self.tokenizer, self.text = tokenizer, text

    def generate(self, requests, sampling):
        ids = self.tokenizer.encode(self.text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return [Generation(ids, [-0.1] * len(ids), self.text) for _ in requests]


def _echo(message: str) -> str:
    return f'<tool_call>{json.dumps({"name": "echo", "arguments": {"message": message}})}</tool_call>'


def test_the_openenv_init_template_runs_in_process_without_extra_arguments(scaffold, monkeypatch):
    monkeypatch.syspath_prepend(str(scaffold))
    env = sleuth.make(f"openenv:{NAME}.server.{NAME}_environment:EchoEnvironment", max_turns=2)
    _, info = env.reset(options={"task": load_tasks("seeds:3")[0]})  # its reset(self) takes no seed
    assert [t["function"]["name"] for t in reset_info(info).tools] == ["echo"]  # the action from step's annotation
    obs, reward, terminated, truncated, info = env.step(_echo("hello"))
    assert json.loads(obs) == {"echoed_message": "hello", "message_length": 5}
    assert reward == pytest.approx(0.5) and not terminated and not truncated
    obs, reward, terminated, truncated, info = env.step(_echo("hi"))
    assert truncated and step_info(info).verdict.score == pytest.approx(0.7)  # the return, cut by max_turns
    env.close()


def test_eight_episodes_share_the_templates_single_session_server(served, tokenizer):
    """The scaffold's server refuses a second session; the episodes wait for the one there is, none fails."""
    before = retry_counts()["env_session"]
    with pytest.warns(UserWarning, match="refused a session while this process held 1"):
        trajs = list(run_episodes(lambda: sleuth.make(served, max_turns=3), load_tasks("seeds:0-7"),
                                  Writes(tokenizer, _echo("hi")), concurrency=8, episode_timeout_s=120))
    assert len(trajs) == 8 and not [t.error for t in trajs if t.failed]
    assert all(len(t.turns) == 3 and t.reward == pytest.approx(0.6) and t.stop_reason == "budget" for t in trajs)
    assert retry_counts()["env_session"] > before  # the waits are counted


def test_a_policy_that_never_calls_validly_ends_at_the_invalid_action_limit(served, tokenizer, tmp_path):
    """Before: the env's own limits never saw a refused reply, so an episode ran to max_turns (64). Now the
    eighth refused reply in a row ends it, scored on what it did (the env's verdict), and the report says why."""
    summary = evaluate_env(lambda: sleuth.make(served), load_tasks("seeds:0-2"), Writes(tokenizer, "I will echo."),
                       tmp_path, concurrency=3, env_id=served, progress=False)
    assert summary["n"] == 3 and summary["n_failed"] == 0
    assert summary["stop_reasons"] == {"invalid_actions": 3}
    rows = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert all(len(r["turns"]) == MAX_INVALID_ACTIONS and r["verdict"]["score"] == 0.0 for r in rows)
    assert "Episodes ended by: invalid_actions 3." in (tmp_path / "report.md").read_text()


def test_a_valid_call_resets_the_count_and_the_limit_is_a_setting(scaffold, monkeypatch):
    monkeypatch.syspath_prepend(str(scaffold))
    env = sleuth.make(f"openenv:{NAME}.server.{NAME}_environment:EchoEnvironment", max_invalid_actions=2)
    env.reset(seed=0)
    assert not env.step("no call")[3] and not env.step(_echo("ok"))[3] and not env.step("no call")[3]
    _, _, terminated, truncated, info = env.step("still none")
    assert truncated and not terminated and step_info(info).stop_reason == "invalid_actions"
    with pytest.raises(ValueError, match="max_invalid_actions must be"):
        sleuth.make(f"openenv:{NAME}.server.{NAME}_environment:EchoEnvironment", max_invalid_actions=0)


def test_the_templates_server_module_runs_as_deployed_from_its_create_app_triple(scaffold, monkeypatch, tokenizer):
    """`openenv:echo_env.server.app:app`: the scaffold's app (its create_app triple, its one-session limit) is
    served in this process, and four episodes at once share its session."""
    monkeypatch.syspath_prepend(str(scaffold))
    target = f"openenv:{NAME}.server.app:app"
    with pytest.warns(UserWarning, match="refused a session"):
        trajs = list(run_episodes(lambda: sleuth.make(target, max_turns=2), load_tasks("seeds:0-3"),
                                  Writes(tokenizer, _echo("hey")), concurrency=4, episode_timeout_s=120))
    assert [t.failed for t in trajs] == [False] * 4 and all(t.reward == pytest.approx(0.6) for t in trajs)
    with pytest.raises(ValueError, match="its env is built by the server"):
        sleuth.make(target, size=3)
