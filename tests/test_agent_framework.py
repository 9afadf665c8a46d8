"""Agents sleuth has never seen, unchanged: one written with a real agent framework from PyPI (pydantic-ai,
examples/pydantic_ai_agent) and one in another language (Node.js, examples/node_agent, through
`--agent-command` / `agent.command`), each through the real `sleuth eval` and `sleuth train` commands and
the real gateway. The tiny random model never calls a tool, so the tool-calling path is driven by a scripted
engine (the engine alone is a test double; the framework, its HTTP client and node are the real ones)."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sleuth.agents.eval.episodes import load_trajectories
from sleuth.agents.gateway import Gateway, create_app
from sleuth.agents.gateway.agent_runner import AgentCommandError, CommandAgent, load_agent, run_agent_episodes
from sleuth.agents.policies.base import Generation, SamplingParams
from sleuth.agents.trajectory import Trajectory
from sleuth.core.net import in_thread
from sleuth.tasks.qa import qa_docs

ROOT = Path(__file__).resolve().parents[1]
PYDANTIC_AI = ROOT / "examples" / "pydantic_ai_agent"
NODE = ROOT / "examples" / "node_agent"
needs_node = pytest.mark.skipif(shutil.which("node") is None, reason="node (Node.js 20+) is not on PATH")


class Scripted:
    """Test double for the engine: replies with the next text of a script, as ids ending with the end-of-turn
    token, and keeps every generation it returned (what the trajectory must hold)."""

    name, version, parallel_calls, max_context = "scripted", 0, 1, None

    def __init__(self, tokenizer, script: list[str]):
        self.tokenizer, self.script, self.returned = tokenizer, list(script), []

    def generate(self, requests, sampling):
        out = []
        for _ in requests:
            text = self.script.pop(0)
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            out.append(Generation(ids, [-0.5] * len(ids), text, "stop"))
        self.returned += out
        return out


def _call(name: str, **arguments) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def _episode_with_script(agent, task, tokenizer, script: list[str]) -> tuple[list[Trajectory], Scripted]:
    policy = Scripted(tokenizer, script)
    gateway = Gateway(policy, SamplingParams(max_tokens=64))
    with in_thread(create_app(gateway)) as url:
        return list(run_agent_episodes(agent, [task], gateway, url, "qa", concurrency=1)), policy


def _sleuth(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    from sleuth.training.zero import DIST_VARS

    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS} | {"OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "sleuth.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _eval(agent: list[str], path: Path, out: Path, model: str) -> subprocess.CompletedProcess:
    return _sleuth("eval", *agent, "--agent-path", str(path), "--verifier", "qa", "--tasks", "hotpotqa:test",
                   "--limit", "2", "--policy", model, "--max-tokens", "8", "--out", str(out))


def _assert_recorded(out: Path, n: int = 2) -> list[Trajectory]:
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == n and summary["n_failed"] == 0, summary
    trajs = load_trajectories(out / "trajectories.jsonl")
    assert trajs and all(t.turns for t in trajs)
    assert all(len(turn.action_ids) == len(turn.action_logprobs) > 0 for t in trajs for turn in t.turns)
    return trajs


def test_a_pydantic_ai_agent_evaluates_unchanged(tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    res = _eval(["--agent", "reader_agent:run"], PYDANTIC_AI, out, tiny_model_dir)
    assert res.returncode == 0, res.stderr[-2000:]
    trajs = _assert_recorded(out)
    assert all(t.verdict is not None and t.meta["agent_answer"] is not None for t in trajs)


def test_the_pydantic_ai_agent_calls_its_tools_in_one_token_exact_chain(hotpot_tasks, tokenizer):
    task = hotpot_tasks[0]
    doc = qa_docs(task).docs[3]
    script = [_call("search", query=task.question), _call("read", title=doc.title), f"Answer: {task.answer}"]
    trajs, policy = _episode_with_script(load_agent("reader_agent:run", str(PYDANTIC_AI)), task, tokenizer, script)
    assert len(trajs) == 1, [t.error for t in trajs]  # pydantic-ai sends its history back whole: no split
    t = trajs[0]
    assert t.meta["calls"] == 3 and t.meta["splits"] == 0 and t.verdict.score == 1.0
    assert [turn.action_ids for turn in t.turns] == [g.ids for g in policy.returned]  # the engine's own ids
    masked_out = tokenizer.decode([i for i, m in zip(t.token_ids(), t.loss_mask(), strict=True) if not m])
    assert doc.text in masked_out  # the read tool's result: context, not trained


def test_sleuth_train_runs_the_pydantic_ai_agent_for_two_steps(tmp_path, tiny_model_dir):
    res = _sleuth("train", "--config", "configs/openai_agent_grpo.yaml", "--out", str(tmp_path),
                  "--set", "agent.entrypoint=reader_agent:run", "--set", f"agent.path={PYDANTIC_AI}",
                  "--set", f"model={tiny_model_dir}", "--set", "rollout.max_tokens=6",
                  "--set", "checkpoint.export_hf=false")
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    trajs = [Trajectory.from_json(x) for f in sorted((tmp_path / "rollouts").glob("*.jsonl"))
             for x in f.read_text().splitlines()]
    assert len({t.episode for t in trajs}) == 2 * 2 * 4 and all(t.turns for t in trajs)  # steps × tasks × group
    assert all(len(turn.action_ids) == len(turn.action_logprobs) > 0 for t in trajs for turn in t.turns)


@needs_node
def test_a_node_agent_evaluates_through_agent_command(tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    res = _eval(["--agent-command", "node agent.mjs"], NODE, out, tiny_model_dir)
    assert res.returncode == 0, res.stderr[-2000:]
    trajs = _assert_recorded(out)
    assert all(t.meta["agent_answer"] == t.turns[-1].action_text.strip() for t in trajs)  # its stdout, stripped
    run = json.loads((out / "run.json").read_text())
    assert run["agent"] == "node agent.mjs" and run["agent_source"]  # the script's hash: an edit is another run


@needs_node
def test_the_node_agent_reads_then_answers_in_one_chain_with_the_task_on_its_stdin(hotpot_tasks, tokenizer):
    task = hotpot_tasks[1]
    doc = qa_docs(task).docs[0]
    script = [_call("read", title=doc.title), f"Answer: {task.answer}"]
    trajs, policy = _episode_with_script(CommandAgent("node agent.mjs", NODE), task, tokenizer, script)
    assert len(trajs) == 1, [t.error for t in trajs]
    t = trajs[0]
    assert t.meta["calls"] == 2 and t.meta["agent_answer"] == f"Answer: {task.answer}" and t.verdict.score == 1.0
    assert [turn.action_ids for turn in t.turns] == [g.ids for g in policy.returned]
    prompt = tokenizer.decode(t.token_ids())
    assert task.question in prompt and doc.text in prompt  # the task from stdin; the tool's result


def test_a_command_that_exits_1_fails_its_episode_and_the_eval(tmp_path, tiny_model_dir, hotpot_tasks):
    first = hotpot_tasks[0].id
    (tmp_path / "odd.py").write_text(  # fails on the first task; answers the second without calling the model
        "import json, sys\n"
        f"if json.load(sys.stdin)['id'] == {first!r}:\n"
        "    print('warming up', file=sys.stderr)\n"
        "    sys.exit('no key given')\n"
        "print('Answer: yes')\n")
    out = tmp_path / "run"
    res = _eval(["--agent-command", f"{sys.executable} odd.py"], tmp_path, out, tiny_model_dir)
    assert res.returncode == 75, res.stderr  # InfraFailure: the failed episode is retried by running it again
    assert "1 of 2 episodes failed (AgentCommandError: " in res.stderr and "odd.py exited with 1: no key given)" \
        in res.stderr, res.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == 1 and summary["n_failed"] == 1 and summary["n_no_calls"] == 1
    trajs = {t.task_id: t for t in load_trajectories(out / "trajectories.jsonl")}
    assert trajs[first].failed and trajs[first].stop_reason == "agent_error" and not trajs[first].turns
    assert trajs[hotpot_tasks[1].id].meta["agent_answer"] == "Answer: yes"  # its stdout, stripped


def _alive(pid: int) -> bool:
    """Whether the process runs (a zombie that no one has reaped yet does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_command_past_its_timeout_is_killed_with_what_it_started(tmp_path):
    pid_file = tmp_path / "child.pid"
    agent = CommandAgent(f"sh -c 'sleep 60 & echo $! > {pid_file}; echo still thinking >&2; wait'", tmp_path,
                         timeout_s=1)
    start = time.monotonic()
    with pytest.raises(AgentCommandError, match=r"ran past its timeout of 1 s: still thinking"):
        agent({"id": "t"}, "http://127.0.0.1:9/v1")
    assert time.monotonic() - start < 10
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)  # the background sleep died with its process group


@pytest.mark.parametrize(("args", "said"), [
    (["--agent", "reader_agent:run", "--agent-command", "node agent.mjs"], "--agent and --agent-command: give one"),
    (["--agent-command", "no-such-program x"], "'no-such-program' is not on PATH"),
    (["--agent-command", "./missing.sh"], "'./missing.sh' is not a file in"),
    (["--agent-command", "node 'agent.mjs"], "No closing quotation"),
])
def test_an_agent_command_that_cannot_run_is_one_line_and_exit_2(tmp_path, args, said):
    res = _sleuth("eval", *args, "--agent-path", str(NODE), "--verifier", "qa", "--tasks", "hotpotqa:test",
                  "--out", str(tmp_path / "run"))
    assert res.returncode == 2 and said in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("overrides", "said"), [
    (["agent.command=node agent.mjs"], "agent.entrypoint and agent.command: give one"),
    (["agent.entrypoint=null", "agent.command=nodejs-missing agent.mjs"], "'nodejs-missing' is not on PATH"),
    (["agent.entrypoint=null", "agent.command=node agent.mjs", "agent.timeout_s=0"], "agent.timeout_s must be > 0"),
])
def test_an_agent_command_config_that_cannot_train_is_refused_before_anything_loads(overrides, said):
    res = _sleuth("train", "--config", "configs/openai_agent_grpo.yaml", "--set", f"agent.path={NODE}",
                  *[x for o in overrides for x in ("--set", o)], timeout=120)
    assert res.returncode == 2 and said in res.stderr and "Traceback" not in res.stderr, res.stderr
