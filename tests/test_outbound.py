"""Outbound forms: sleuth's tool envs driven by other libraries' own clients and trainers (openenv-core's
`MCPToolClient` and `GenericEnvClient` against `sleuth serve openenv`, `gem.make`, TRL's `GRPOTrainer` with an
`environment_factory`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sleuth.core.net import subprocess_server
from sleuth.envs.outbound.session import OVER, ToolSession
from sleuth.envs.outcome import reset_info, step_info
from sleuth.tasks import write_tasks

DOCREAD = "sleuth/DocRead-v0"


def test_a_session_plays_by_tool_calls_with_the_envs_budget_and_verifier(hotpot_tasks):
    s = ToolSession(DOCREAD, hotpot_tasks[:3], budget=2)
    assert s.reset(seed=4).details["task_id"] == hotpot_tasks[1].id  # seed i plays task i mod n
    assert "Documents" in s.reset(task_id=hotpot_tasks[2].id).text and hotpot_tasks[2].answer not in s.system
    bad = s.call("fly", {})
    assert bad.error and "unknown tool" in bad.text and not bad.done
    assert s.call("read", {"doc": 0}).error is None
    ran_out = s.call("read", {"doc": 1})
    assert ran_out.truncated and ran_out.reward == 0.0 and s.final_reward() == 0.0
    assert s.call("answer", {"text": "x"}).text == OVER
    s.reset(task_id=hotpot_tasks[0].id)
    end = s.call("answer", {"text": hotpot_tasks[0].answer})
    assert end.terminated and end.reward == 1.0 == s.final_reward() and end.details["verdict"]["score"] == 1.0
    with pytest.raises(KeyError, match="no task"):
        s.reset(task_id="nope")
    with pytest.raises(TypeError, match="not a tool env"):
        ToolSession("reasoning_gym:chain_sum", hotpot_tasks[:1])


@pytest.fixture(scope="module")
def _openenv_server(hotpot_tasks, tmp_path_factory):
    """`sleuth serve openenv --env sleuth/DocRead-v0` over three tasks, shared by the tests that drive it (one
    server start, not one per test); each server is killed at the module's end."""
    path = tmp_path_factory.mktemp("openenv") / "tasks.jsonl"
    write_tasks(hotpot_tasks[:3], path)
    served: dict = {}
    with contextlib.ExitStack() as stack:
        def url() -> str:
            if "proc" not in served or served["proc"].poll() is not None:
                served["url"], served["proc"] = stack.enter_context(
                    subprocess_server(["openenv", "--env", DOCREAD, "--tasks", str(path)]))
            return served["url"]
        yield url


@pytest.fixture
def openenv_url(_openenv_server) -> str:
    """The shared server's URL; one that an earlier test left dead is replaced, so that fault stays in its test."""
    return _openenv_server()


def test_sleuth_serve_openenv_is_driven_by_openenv_cores_own_clients(hotpot_tasks, openenv_url):
    from openenv.core.env_server.mcp_types import CallToolAction
    from openenv.core.generic_client import GenericEnvClient
    from openenv.core.mcp_client import MCPToolClient

    async def mcp() -> tuple:
        async with MCPToolClient(base_url=openenv_url) as client:
            first = await client.reset(seed=1)
            names = [t.name for t in await client.list_tools()]
            text = await client.call_tool("read", doc=0)
            end = await client.step(CallToolAction(tool_name="answer",
                                                   arguments={"text": hotpot_tasks[1].answer}))
            return first, names, text, end

    first, names, text, end = asyncio.run(mcp())
    assert first.observation.result.startswith("Question:") and names == ["read", "answer"]
    assert isinstance(text, str) and text.startswith("[0]")
    assert end.done and end.reward == 1.0

    with GenericEnvClient(base_url=openenv_url).sync() as client:
        reset = client.reset(seed=2)
        assert reset.observation["task_id"] == hotpot_tasks[2].id
        assert hotpot_tasks[2].question in reset.observation["prompt"]
        wrong = client.step({"type": "call_tool", "tool_name": "read", "arguments": {"page": 1}})
        assert "missing argument" in wrong.observation["call_error"] and not wrong.done
        done = client.step({"type": "call_tool", "tool_name": "answer", "arguments": {"text": "no idea"}})
        assert done.done and done.reward == 0.0


def test_a_served_sleuth_env_comes_back_into_sleuth_as_an_openenv_mcp_env(hotpot_tasks, openenv_url):
    """The round trip: `sleuth serve openenv` → `openenv:http://…` (the openenv family reads its MCP tools)."""
    import sleuth

    env = sleuth.make(f"openenv:{openenv_url}")
    obs, info = env.reset(seed=1)
    tools = [t["function"]["name"] for t in reset_info(info).tools]
    assert obs.startswith("Question:") and tools == ["read", "answer"]
    read = env.step(f'<tool_call>{json.dumps({"name": "read", "arguments": {"doc": 0}})}</tool_call>')
    assert read[0].startswith("[0]") and not read[2]
    call = {"name": "answer", "arguments": {"text": hotpot_tasks[1].answer}}
    _, reward, terminated, _, info = env.step(f"<tool_call>{json.dumps(call)}</tool_call>")
    assert terminated and reward == 1.0 and step_info(info).verdict.score == 1.0
    env.close()


def test_serve_openenv_refuses_bad_input_in_one_line(tmp_path, capsys, monkeypatch):
    """A typo'd env as the user meets it: the whole `sleuth` process prints one line (no warning, no traceback) and
    exits non-zero. The other refusals run the same `main` in this process (no interpreter to start per case), where
    a server that starts instead of refusing fails the test rather than serving forever."""
    import uvicorn
    from procs import sleuth_here

    out = subprocess.run([sys.executable, "-m", "sleuth.cli", "serve", "openenv", "--env", "sleuth/DocRed-v0",
                          "--tasks", "hotpotqa:test"], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "did you mean" in out.stderr and len(out.stderr.strip().splitlines()) == 1, \
        out.stderr
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: pytest.fail("served what it should refuse"))
    for args, says in ((["--env", DOCREAD, "--tasks", str(tmp_path / "none.jsonl")], "cannot serve"),
                       (["--env", "reasoning_gym:chain_sum", "--tasks", "seeds:0-3"], "not a tool env")):
        refused = sleuth_here("serve", "openenv", *args, capfd=capsys)
        assert refused.returncode != 0 and says in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr


def test_gem_make_builds_sleuth_envs_after_one_import(hotpot_tasks):
    import gem

    import sleuth.envs.outbound.gem  # noqa: F401  (registers sleuth:<id> with GEM)

    env = gem.make("sleuth:DocRead-v0", tasks=hotpot_tasks[:2])
    obs, info = env.reset(seed=1)
    assert info["task_id"] == hotpot_tasks[1].id and "answer" in obs and hotpot_tasks[1].question in obs
    obs, reward, terminated, truncated, info = env.step("I think I will read.")  # no tool call: the env says so
    assert not terminated and reward == 0.0 and info["error"]  # GEM's own info
    answer = {"name": "answer", "arguments": {"text": hotpot_tasks[1].answer}}
    call = f"<tool_call>{json.dumps(answer)}</tool_call>"
    _, reward, terminated, truncated, info = env.step(call)
    assert terminated and not truncated and reward == 1.0 and info["verdict"]["score"] == 1.0


def test_trl_reads_the_same_tool_schemas_sleuth_shows_the_model(hotpot_tasks):
    from transformers.utils import get_json_schema

    from sleuth.envs.outbound.trl import environment_factory, task_dataset

    DocRead = environment_factory(DOCREAD, hotpot_tasks[:3])
    env = DocRead()
    for schema in env.session.tool_schemas():
        theirs = get_json_schema(getattr(env, schema["function"]["name"]))
        assert {k: v for k, v in theirs["function"].items() if k != "return"} == schema["function"]
    ds = task_dataset(DocRead)
    assert ds["task_id"] == [t.id for t in hotpot_tasks[:3]]
    assert env.reset(**ds[2]).startswith("Question: " + hotpot_tasks[2].question)
    assert env.get_reward() == 0.0  # no answer given: what a sleuth episode that ran out of turns scores
    assert env.answer(text=hotpot_tasks[2].answer) and env.get_reward() == 1.0


@pytest.mark.slow
def test_trls_grpo_trainer_trains_two_steps_on_a_sleuth_env(tiny_model_dir, hotpot_tasks, tmp_path):
    """TRL's own GRPOTrainer, its tool loop and reward: a tiny model first taught one tool call (`answer`
    with "yes"), so that TRL parses and runs it in the env, whose verifier scores the rollouts."""
    script = Path(__file__).parent / "foreign" / "trl_grpo_env.py"
    out = subprocess.run([sys.executable, str(script), tiny_model_dir, str(tmp_path)], capture_output=True,
                         text=True, timeout=900, env={**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    logs = [line for line in out.stdout.splitlines() if line.startswith("STEP ")]
    assert len(logs) == 2
    steps = [json.loads(line[5:]) for line in logs]
    assert all(s["tools/call_frequency"] > 0 for s in steps)  # the env's tools ran inside TRL's loop
    assert any(s["rewards/DocReadTools/mean"] > 0 for s in steps)  # sleuth's verifier scored a right answer
