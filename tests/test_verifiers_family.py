"""verifiers both ways. Inbound, the `verifiers:` env family: a verifiers (v1) environment as a user writes one
(`tests/foreign/vf_calc`: a taskset, an MCP toolset, an async rubric), made from sleuth's main venv, where the PyPI
`verifiers` cannot be installed: its episodes run in verifiers' own venv (`make verifiers`) behind sleuth's Remote
env protocol, with verifiers' own harness and tools, and the policy in the model's seat. Outbound: verifiers' own
`vf-eval` runs sleuth's DocRead as the verifiers env `sleuth-env` against sleuth's gateway."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

import sleuth
from sleuth.agents.loop.episodes import run_episodes
from sleuth.agents.policies.base import Generation
from sleuth.agents.policies.load import load_tokenizer
from sleuth.envs.families import venv_server, verifiers_server
from sleuth.envs.families.verifiers_env import message_text, pypi_verifiers_importable
from sleuth.envs.families.verifiers_server import VERIFIERS
from sleuth.envs.outcome import reset_info, step_info
from sleuth.envs.remote import RemoteEnvError
from sleuth.tasks import load_tasks

FOREIGN = str(Path(__file__).parent / "foreign")
REPO = Path(__file__).resolve().parents[1]
ENV = "verifiers:vf-calc"


def _venv_python() -> str | None:
    try:
        return verifiers_server.verifiers_python()
    except ImportError:
        return None


pytestmark = pytest.mark.skipif(_venv_python() is None, reason="no verifiers venv (make verifiers)")


@pytest.fixture(autouse=True)
def _vf_calc_importable(monkeypatch):
    """The user's env package on the path of the server (and of the toolset processes it starts)."""
    monkeypatch.setenv("PYTHONPATH", FOREIGN)


class Adder:
    """Calls the env's `calc_add` on the two numbers of the question, then answers with the tool's result."""

    name, version, max_context, parallel_calls = "adder", 0, None, 1

    def __init__(self, wrong_on: str = ""):
        self.tokenizer, self.wrong_on = load_tokenizer("smollm2"), wrong_on  # the task it answers one too high

    def generate(self, requests, sampling):
        out = []
        for req in requests:
            last = req.messages[-1]["content"]
            if req.turn == 0:
                a, b = re.findall(r"\d+", last)[:2]
                text = f'<tool_call>\n{{"name": "calc_add", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>'
            else:
                result = int(re.findall(r"-?\d+", last)[-1])
                text = f"The sum is {result + (req.task.id == self.wrong_on)}."
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            out.append(Generation(ids, [0.0] * len(ids), text))
        return out


class FollowUp:
    """A model that answers a sum, then adds 1 to its last answer whatever the user asks it to add (row 1 asks for 2,
    so it scores 0 there): a function of the conversation alone, so that vf-eval (behind sleuth's gateway) and
    `sleuth eval` (as the policy) get the same replies from it."""

    name, version, max_context, parallel_calls = "vf-follow-up", 0, None, 1

    def __init__(self, tokenizer, seed: int = 0):
        self.tokenizer = tokenizer

    def generate(self, requests, sampling):
        out = []
        for req in requests:
            said = [(m.get("role"), message_text(m)) for m in req.messages]
            asked = next(text for role, text in reversed(said) if role == "user")
            if sum_ := re.search(r"What is (\d+) \+ (\d+)\?", asked):
                text = str(int(sum_[1]) + int(sum_[2]))
            else:
                text = str(int(next(text for role, text in reversed(said) if role == "assistant")) + 1)
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            out.append(Generation(ids, [0.0] * len(ids), text))
        return out


def test_the_main_venv_does_not_import_pypi_verifiers_and_the_server_does():
    """From the repository root sleuth's own `verifiers/` folder shadows the PyPI package; the server runs with
    `python -P`, which keeps the working directory off sys.path."""
    assert not pypi_verifiers_importable()  # the main venv (openai 3.x): the family goes remote
    check = "from sleuth.envs.families.verifiers_env import pypi_verifiers_importable as f; print(f())"
    shadowed = subprocess.run([_venv_python(), "-c", check], cwd=REPO, capture_output=True, text=True)
    safe = subprocess.run([_venv_python(), "-P", "-c", check], cwd=REPO, capture_output=True, text=True)
    assert shadowed.stdout.strip() == "False" and safe.stdout.strip() == "True", (shadowed.stderr, safe.stderr)


def test_verifiers_runs_its_own_harness_tools_and_rubric_with_the_policy_in_the_models_seat():
    trajs = sorted(run_episodes(lambda: sleuth.make(ENV), load_tasks("seeds:0-1"), Adder(wrong_on="seed-1"),
                                concurrency=2), key=lambda t: t.task_id)
    assert [t.verdict.score for t in trajs] == [1.0, 0.0]  # the rubric, not the loop, decides
    t = trajs[0]
    assert t.verdict.details["reward/correct"] == 1.0 and t.verdict.details["metric/tool_calls"] == 1.0
    assert t.verdict.details["stop"] == "agent_completed" and len(t.turns) == 2
    prompt = load_tokenizer("smollm2").decode(t.prompt_ids)
    assert "You are a careful calculator." in prompt and '"name": "calc_add"' in prompt and "What is 17 + 25?" in prompt
    assert t.turns[0].observation.strip() == "42"  # the MCP tool's result, as verifiers' harness returned it


def test_bad_ids_arguments_and_rows_are_refused_in_one_line(capsys, tmp_path):
    from sleuth.cli.main import main
    from sleuth.training.config import load_config

    with pytest.raises(ValueError, match="cannot build verifiers:no-such-env: .*taskset 'no-such-env' not found"):
        sleuth.make("verifiers:no-such-env")
    with pytest.raises(ValueError, match="takes config .* not colour"):
        sleuth.make(ENV, colour="red")
    trajs = list(run_episodes(lambda: sleuth.make(ENV), load_tasks("seeds:7"), Adder()))
    assert trajs[0].failed and "not a row of verifiers:vf-calc, which has 4" in trajs[0].error
    assert main(["eval", "--env", ENV, "--policy", "random", "--out", str(tmp_path)]) == 2
    assert "--tasks is required for verifiers:vf-calc" in capsys.readouterr().err
    with pytest.raises(ValueError, match="name the rows"):
        load_config(overrides={"env": ENV})


def test_a_harness_that_rewrites_the_conversation_fails_the_episode_in_one_line():
    env = sleuth.make("verifiers:vf-forgetful")
    env.reset(options={"task": load_tasks("seeds:0")[0]})
    with pytest.raises(RemoteEnvError, match="rewrote the conversation"):
        env.step("Hello.")
    env.close()


def test_a_killed_server_fails_the_episode_and_the_next_env_starts_another():
    env = sleuth.make(ENV)
    env.reset(options={"task": load_tasks("seeds:0")[0]})
    proc = venv_server.server_process(VERIFIERS)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    with pytest.raises(RemoteEnvError, match="unreachable"):
        env.step('<tool_call>{"name": "calc_add", "arguments": {"a": 1, "b": 2}}</tool_call>')
    trajs = list(run_episodes(lambda: sleuth.make(ENV), load_tasks("seeds:2"), Adder()))
    assert trajs[0].verdict.score == 1.0 and venv_server.server_process(VERIFIERS).pid != proc.pid


def test_null_harness_runs_offline_and_an_episode_cut_by_max_turns_leaves_nothing_behind():
    """verifiers' `null` harness (chat and the env's tools, no shell) over the same bundled program; an episode
    that sleuth's `max_turns` truncates is unscored, and the next one on the same env starts clean."""
    env = sleuth.make(ENV, max_turns=1, config={"agent": {"harness": {"id": "null"}}})
    for seed, (a, b) in ((3, (26, 46)), (2, (23, 39))):
        _, info = env.reset(options={"task": load_tasks(f"seeds:{seed}")[0]})
        assert [t["function"]["name"] for t in reset_info(info).tools] == ["calc_add"]  # its tools only: no shell
        obs, _, terminated, truncated, info = env.step(
            f'<tool_call>{{"name": "calc_add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>')
        assert truncated and not terminated and obs.strip() == str(a + b)
        assert step_info(info).verdict.details["stop"] == "max_turns" and step_info(info).verdict.score == 0.0
    env.close()


@pytest.mark.long
def test_a_model_evaluates_and_grpo_trains_two_steps_on_a_verifiers_env(tiny_model_dir, tmp_path):
    """`sleuth eval` with a transformers policy, then GRPO, on a verifiers env; training on the rows it is evaluated
    on is refused. The policy is the tiny random model: the plumbing is checked, which SmolLM2 would only slow."""
    import json

    from sleuth.cli.main import main
    from sleuth.core.errors import ConfigError
    from sleuth.training.config import load_config
    from sleuth.training.rl.trainer import Trainer

    out = tmp_path / "eval"
    assert main(["eval", "--env", ENV, "--tasks", "seeds:0", "--policy", tiny_model_dir, "--max-tokens", "48",
                 "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["verdict"]["details"]["stop"] == "agent_completed"
    cfg = load_config(overrides={"model": tiny_model_dir, "env": ENV, "tasks": "seeds:2-3", "eval.tasks": "seeds:0-1",
                                 "max_steps": 2, "out": str(tmp_path / "train"), "rollout.group_size": 2,
                                 "rollout.tasks_per_step": 1, "rollout.max_tokens": 8, "rollout.temperature": 1.0,
                                 "deepspeed.zero_stage": 0, "checkpoint.every": 100})
    rows = Trainer(cfg, progress=False).train()
    assert len(rows) == 2 and all(r["episodes/sampled"] == 2 and r["episodes/failed"] == 0 for r in rows)
    leak = load_config(overrides={"model": tiny_model_dir, "env": ENV, "tasks": "seeds:1-2", "eval.tasks": "seeds:0-1",
                                  "out": str(tmp_path / "leak")})
    with pytest.raises(ConfigError, match="seed-1"):  # training on the rows it is evaluated on is refused
        Trainer(leak, progress=False)


def test_vf_eval_runs_a_sleuth_env_against_sleuths_gateway(tokenizer, tmp_path):
    """verifiers' own CLI, in its venv, on `sleuth-env` (DocRead over hotpotqa:dev): the model behind sleuth's gateway
    reads a supporting document and answers the gold; the env's verifier is the rubric (F1 1, half the support)."""
    import json

    from test_gateway import Scripted

    from sleuth.agents.gateway import Gateway, create_app
    from sleuth.agents.policies.base import SamplingParams
    from sleuth.core.net import in_thread
    from sleuth.tasks.qa import qa_docs

    task = load_tasks("hotpotqa:dev", limit=1)[0]
    read = json.dumps({"name": "read", "arguments": {"doc": qa_docs(task).gold()[0]}})
    answer = json.dumps({"name": "answer", "arguments": {"text": task.answer}})
    engine = Scripted(tokenizer, [f"<tool_call>\n{read}\n</tool_call>", f"<tool_call>\n{answer}\n</tool_call>"])
    vf_eval = str(Path(_venv_python()).parent / "vf-eval")
    with in_thread(create_app(Gateway(engine, SamplingParams(max_tokens=64)))) as url:
        done = subprocess.run([vf_eval, "sleuth-env", "--env.taskset.tasks", "hotpotqa:dev", "--env.taskset.limit", "1",
                               "--client.base-url", f"{url}/v1", "--client.api-key-var", "SLEUTH_TEST_KEY",
                               "--model", "scripted", "-n", "1", "--no-push", "--no-rich", "-o", str(tmp_path)],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "SLEUTH_TEST_KEY": "any"})
    assert done.returncode == 0, done.stderr[-2000:]
    (episode,) = [json.loads(line) for f in tmp_path.glob("*/traces.jsonl") for line in f.read_text().splitlines()]
    (trace,) = episode["traces"] if isinstance(episode["traces"], list) else episode["traces"].values()
    assert trace["ok"] and trace["rewards"]["sleuth_score"]["score"] == 1.0
    assert trace["metrics"]["f1"] == 1.0 and trace["metrics"]["support_recall"] == 0.5
    assert engine.script == []  # both replies came from the engine behind the gateway


def test_reset_by_seed_from_the_main_venv_plays_the_row_it_plays_in_verifiers_own_venv():
    """`reset(seed=row)`, no task: the Remote env sends the seed and the env on the server takes it as in process."""
    import json

    env = sleuth.make(ENV)
    obs, info = env.reset(seed=2)
    env.close()
    here = ("import json, sleuth; e = sleuth.make('verifiers:vf-calc'); o, i = e.reset(seed=2); e.close(); "
            "from sleuth.envs.outcome import reset_info; print(json.dumps([o, i['task_id'], reset_info(i).messages]))")
    there = subprocess.run([_venv_python(), "-P", "-c", here], capture_output=True, text=True, timeout=300)
    assert there.returncode == 0, there.stderr[-2000:]
    assert [obs, info["task_id"], reset_info(info).messages] == json.loads(there.stdout.strip().splitlines()[-1])
    assert "What is 23 + 39?" in obs and info["task_id"] == "seed-2"


def test_an_env_packages_own_env_runs_as_vf_eval_runs_it_with_the_same_rewards(tokenizer, tmp_path):
    """`tests/foreign/vf_followup` exports its own `vf.Env` (a scripted user's follow-up turn, a `finalize` metric):
    vf-eval (the model behind sleuth's gateway) and `sleuth eval` (the same model as the policy) score rows 0-1 alike,
    1 and 0; a run without the env's own follow-up would score 0 on every row."""
    import json

    from sleuth.agents.gateway import Gateway, create_app
    from sleuth.agents.policies.base import SamplingParams
    from sleuth.agents.policies.load import SCRIPTED_POLICIES
    from sleuth.cli.main import main
    from sleuth.core.net import in_thread

    vf_eval = str(Path(_venv_python()).parent / "vf-eval")
    with in_thread(create_app(Gateway(FollowUp(tokenizer), SamplingParams(max_tokens=16)))) as url:
        done = subprocess.run([vf_eval, "vf-followup", "--client.base-url", f"{url}/v1", "--client.api-key-var",
                               "SLEUTH_TEST_KEY", "--model", "scripted", "-n", "2", "--no-push", "--no-rich",
                               "--env.agent.runtime.type", "subprocess",  # what sleuth runs (verifiers': hosted)
                               "-o", str(tmp_path / "vf")], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "SLEUTH_TEST_KEY": "any"})
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = {}
    for line in (tmp_path / "vf").glob("**/traces.jsonl").__next__().read_text().splitlines():
        episode = json.loads(line)
        (trace,) = episode["traces"] if isinstance(episode["traces"], list) else episode["traces"].values()
        assert trace["ok"] and trace["metrics"]["user_turns"] == 2.0
        row = int(episode["task"]["data"]["name"].removeprefix("sum-"))
        theirs[row] = sum(r["score"] * r.get("weight", 1.0) for r in trace["rewards"].values())

    SCRIPTED_POLICIES.register("vf-follow-up", FollowUp)
    try:
        assert main(["eval", "--env", "verifiers:vf-followup", "--tasks", "seeds:0-1", "--policy", "vf-follow-up",
                     "--out", str(tmp_path / "sleuth")]) == 0
    finally:
        SCRIPTED_POLICIES.unregister("vf-follow-up")
    rows = [json.loads(line) for line in (tmp_path / "sleuth" / "trajectories.jsonl").read_text().splitlines()]
    ours = {int(r["task_id"].removeprefix("seed-")): r["verdict"]["score"] for r in rows}
    assert ours == theirs == {0: 1.0, 1: 0.0}
    for r in rows:
        assert r["verdict"]["details"]["metric/user_turns"] == 2.0 and len(r["turns"]) == 2
        assert "Now add" in r["turns"][0]["observation"]  # the env's scripted follow-up, as the policy saw it


def test_forms_sleuth_does_not_run_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"seats 2 agents \(assistant, user\): sleuth's policy plays one seat"):
        sleuth.make(ENV, config={"id": "user-sim"})  # verifiers' modeled-user env, paired with the taskset
    with pytest.raises(ValueError, match=r"verifiers:vf-legacy is a verifiers < 0.4 environment \(`load_environment"):
        sleuth.make("verifiers:vf-legacy")
