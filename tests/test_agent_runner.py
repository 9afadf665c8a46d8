"""User agents run unchanged through `sleuth eval --agent`: the agent files of examples/openai_agent (written
against the real `openai` SDK alone) against the real gateway and a real model (the tiny random one, for
speed), in the real command. What the agent received is logged by a wrapper that adds an httpx response hook to
the SDK's own client and runs the example's `run` as it is."""

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from sleuth.agents.eval.episodes import _evaluate_run, load_trajectories
from sleuth.agents.gateway.agent_runner import public_task
from sleuth.agents.trajectory import Trajectory, Turn
from sleuth.tasks import load_tasks
from sleuth.tasks.base import Task
from sleuth.tasks.registry import label_fields
from sleuth.verifiers.base import Verdict
from sleuth.verifiers.extract import extract_answer

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "openai_agent"

# Runs an example agent unchanged; logs the task it was given and every chat completion it received.
RECORDING = f'''
import json, os, sys, threading
import httpx, openai

sys.path.insert(0, {str(EXAMPLES)!r})
LOG, LOCK = os.environ["AGENT_LOG"], threading.Lock()


def _write(record):
    with LOCK, open(LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\\n")


def _received(response):
    response.read()
    if response.request.url.path.endswith("/chat/completions"):
        _write({{"url": str(response.request.url), "completion": response.json()}})


class RecordingOpenAI(openai.OpenAI):
    def __init__(self, **kwargs):
        super().__init__(http_client=httpx.Client(event_hooks={{"response": [_received]}}), **kwargs)


openai.OpenAI = RecordingOpenAI  # before the examples import it
import append_agent, rewrite_agent


def _logged(fn):
    def run(task, base_url):
        _write({{"task": task, "base_url": base_url}})
        return fn(task, base_url)
    return run


append = _logged(append_agent.run)
rewrite = _logged(rewrite_agent.run)
'''

# One task raises, one returns without calling the model, one calls it through the async client.
ODD = '''
import openai

async def run(task, base_url):
    if task["id"] == FIRST:
        raise ValueError("the agent gave up")
    if task["id"] == SECOND:
        return "Answer: nothing"
    client = openai.AsyncOpenAI(base_url=base_url, api_key="x")
    reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": task["question"]}])
    return reply.choices[0].message.content
'''


def _sleuth(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sleuth.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, timeout=300)


def _eval_agent(agent: str, path: Path, out: Path, model: str, log: Path | None = None, limit: int = 3):
    return _sleuth("eval", "--agent", agent, "--agent-path", str(path), "--verifier", "qa", "--tasks",
                   "hotpotqa:test", "--limit", str(limit), "--policy", model, "--max-tokens", "8",
                   "--temperature", "1", "--out", str(out), env={"AGENT_LOG": str(log or out / "log")})


def _received(log: Path) -> tuple[list[dict], dict[str, list[str]]]:
    """The tasks the agent got, and per session the assistant texts it received, in order."""
    tasks, texts = [], defaultdict(list)
    for line in log.read_text().splitlines():
        rec = json.loads(line)
        if "task" in rec:
            tasks.append(rec["task"])
        else:
            session = rec["url"].split("/s/", 1)[1].split("/", 1)[0]
            texts[session] += [c["message"]["content"] or "" for c in rec["completion"]["choices"]]
    return tasks, texts


def test_public_task_holds_no_answer_aliases_or_labels_of_real_tasks(hotpot_tasks):
    for task in [*hotpot_tasks, *load_tasks("musique:dev", limit=20)]:
        seen = public_task(task)
        assert set(seen) == {"id", "question", "payload", "split", "source"}
        assert seen["payload"]["docs"] == task.payload["docs"] and "supporting" not in seen["payload"]
        # what is left beside the question and the documents the agent must read holds nothing of the gold
        rest = json.dumps({**seen, "question": None, "payload": {**seen["payload"], "docs": None}})
        for gold in [task.answer, *task.aliases, *task.payload["supporting"]]:
            assert gold not in rest, (task.id, gold)
        assert json.loads(json.dumps(seen)) == seen  # plain JSON, as a process in any language would get it
    seen["payload"]["docs"].clear()  # a copy: an agent that edits its task changes nothing of the run's
    assert task.payload["docs"]


def test_code_and_swe_tasks_reach_the_agent_without_their_tests_or_the_bug():
    mbpp = load_tasks("mbpp", limit=1)[0]
    assert set(public_task(mbpp)["payload"]) == {"test_setup_code", "signature"}
    swe = load_tasks("swe:toolz-1.2.0", limit=1)[0]
    seen = public_task(swe)["payload"]
    assert not set(label_fields(swe.source)) & set(seen) and "sdist" in seen
    assert swe.answer not in json.dumps(public_task(swe)) and swe.payload["bug_patch"] not in json.dumps(seen)
    plain = Task(id="x", question="q", answer="a", aliases=["b"], payload={"k": 1}, source="mine")
    assert public_task(plain) == {"id": "x", "question": "q", "payload": {"k": 1}, "split": "", "source": "mine"}


@pytest.mark.parametrize("agent,said", [
    ("no_such_module:run", "no module 'no_such_module' in"),
    ("append_agent:no_such_function", "has no 'no_such_function'; it defines: call_tool, run, words"),
    ("append_agent:words", "cannot be called as run(task, base_url)"),
])
def test_an_agent_that_cannot_load_is_one_line_and_exit_2(tmp_path, agent, said):
    res = _sleuth("eval", "--agent", agent, "--agent-path", str(EXAMPLES), "--verifier", "qa", "--tasks",
                  "hotpotqa:test", "--out", str(tmp_path / "run"))
    assert res.returncode == 2 and said in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "run").exists()


def test_env_options_and_a_missing_verifier_are_refused_with_an_agent(tmp_path):
    base = ["eval", "--agent", "append_agent:run", "--agent-path", str(EXAMPLES), "--tasks", "hotpotqa:test",
            "--out", str(tmp_path / "run")]
    res = _sleuth(*base, "--verifier", "qa", "--env", "sleuth/DocRead-v0")
    assert res.returncode == 2 and "--env cannot go with --agent" in res.stderr, res.stderr
    res = _sleuth(*base)
    assert res.returncode == 2 and "an agent needs a verifier (--verifier NAME)" in res.stderr, res.stderr


def test_the_append_agent_evaluates_unchanged_and_every_text_it_received_is_recorded(tmp_path, tiny_model_dir,
                                                                                       hotpot_tasks, tokenizer):
    (tmp_path / "recording.py").write_text(RECORDING)
    out, log = tmp_path / "run", tmp_path / "log.jsonl"
    res = _eval_agent("recording:append", tmp_path, out, tiny_model_dir, log)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == 3 and summary["n_failed"] == 0 and summary["mean_calls"] >= 2  # the nudge: 2+ calls
    tasks, texts = _received(log)
    assert sorted(tasks, key=lambda t: t["id"]) == sorted(map(public_task, hotpot_tasks[:3]), key=lambda t: t["id"])
    trajs = load_trajectories(out / "trajectories.jsonl")
    assert len(trajs) == 3 and {t.episode for t in trajs} == set(texts)  # one chain each: appended
    for t in trajs:
        assert t.segments == 1 and t.meta["calls"] == len(t.turns) == len(texts[t.episode])
        assert t.task_id == t.group and t.reward == t.verdict.score and t.terminated
        for turn, text in zip(t.turns, texts[t.episode], strict=True):
            assert turn.action_ids and len(turn.action_logprobs) == len(turn.action_ids)
            assert turn.action_text == text == tokenizer.decode(turn.action_ids, skip_special_tokens=True)
        assert t.meta["agent_answer"] == texts[t.episode][-1]
        assert t.verdict.details["prediction"] == extract_answer(t.meta["agent_answer"])  # as `sleuth score`


def test_a_rewriting_agent_gives_segments_that_train_only_what_it_received_and_counts_episodes(
        tmp_path, tiny_model_dir, tokenizer):
    (tmp_path / "recording.py").write_text(RECORDING)
    out, log = tmp_path / "run", tmp_path / "log.jsonl"
    res = _eval_agent("recording:rewrite", tmp_path, out, tiny_model_dir, log)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == 3 and summary["mean_segments"] >= 2 and summary["splits"] >= 3
    _, texts = _received(log)
    by_episode = defaultdict(list)
    for t in load_trajectories(out / "trajectories.jsonl"):
        by_episode[t.episode].append(t)
    assert set(by_episode) == set(texts)
    for session, segments in by_episode.items():
        assert len(segments) >= 2 and [s.segment for s in segments] == list(range(len(segments)))
        assert all(s.verdict == segments[0].verdict is not None for s in segments)  # the episode's verdict on each
        masked = [tokenizer.decode([i for i, m in zip(s.token_ids(), s.loss_mask(), strict=True) if m],
                                   skip_special_tokens=True) for s in segments]
        assert masked == texts[session]  # under the mask: exactly what the model sent, never a prompt or note


def test_an_agent_that_raises_fails_its_episode_and_one_without_calls_is_scored(tmp_path, tiny_model_dir,
                                                                                  hotpot_tasks):
    first, second = hotpot_tasks[0].id, hotpot_tasks[1].id
    source = f"FIRST, SECOND = {first!r}, {second!r}\n{ODD}"
    (tmp_path / "odd.py").write_text(source)
    line = source.splitlines().index('        raise ValueError("the agent gave up")') + 1
    out = tmp_path / "run"
    res = _eval_agent("odd:run", tmp_path, out, tiny_model_dir)
    assert res.returncode == 75, res.stderr  # InfraFailure: the failed episode is retried by running it again
    assert f"1 of 3 episodes failed (ValueError: the agent gave up (at odd.py:{line}))" in res.stderr, res.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == 2 and summary["n_failed"] == 1 and summary["n_no_calls"] == 1
    trajs = {t.task_id: t for t in load_trajectories(out / "trajectories.jsonl")}
    assert trajs[first].failed and trajs[first].stop_reason == "agent_error" and not trajs[first].turns
    assert trajs[second].stop_reason == "no_calls" and trajs[second].verdict is not None and not trajs[second].turns
    assert trajs[hotpot_tasks[2].id].turns[0].action_ids  # the async client's call, recorded
    res = _eval_agent("odd:run", tmp_path, out, tiny_model_dir)  # the same command retries the failed episode only
    summary = json.loads((out / "summary.json").read_text())
    assert res.returncode == 75 and summary["retried_failed"] == 1 and summary["n"] == 2
    assert len(load_trajectories(out / "failed.jsonl")) == 1 and len(load_trajectories(out / "trajectories.jsonl")) == 3


def _episode(task: Task, session: str, n: int) -> list[Trajectory]:
    return [Trajectory(task.id, "gateway", [1], [Turn([2], [-0.5], "a")], reward=1.0, terminated=True,
                       verdict=Verdict(1.0, {"f1": 1.0}),
                       episode=session, segment=i, segments=n, meta={"calls": n, "splits": n - 1})
            for i in range(n)]


def test_summary_and_resume_count_episodes_not_segments_and_rerun_a_torn_episode(tmp_path):
    tasks = [Task(id=f"t{i}", question="q", answer="a") for i in range(3)]
    runs: list[list[str]] = []

    def run(todo):
        runs.append([t.id for t in todo])
        for k, t in enumerate(todo):
            yield from _episode(t, f"{t.id}.{len(runs)}.{k}", 3)

    summary = _evaluate_run(run, tasks, tmp_path, "test", {"policy": "p"}, True, False, 1, None)
    assert summary["n"] == 3 and summary["mean_segments"] == 3 and summary["splits"] == 6
    assert summary["mean_turns"] == 3 and summary["pass@1"] == 1.0
    lines = (tmp_path / "trajectories.jsonl").read_text().splitlines()
    (tmp_path / "trajectories.jsonl").write_text("\n".join(lines[:-1]) + "\n")  # killed while writing t2's last
    summary = _evaluate_run(run, tasks, tmp_path, "test", {"policy": "p"}, True, False, 1, None)
    assert runs == [["t0", "t1", "t2"], ["t2"]] and summary["n"] == 3
    assert len(load_trajectories(tmp_path / "trajectories.jsonl")) == 9
