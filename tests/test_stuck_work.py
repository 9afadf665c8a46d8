"""Stuck work has a policy: an episode stuck in its env step, its reset, its generation or a user agent's tool
fails as `timeout` at `rollout.episode_timeout_s` (never scored, its env closed, the other episodes go on),
and `rollout.max_consecutive_failures` failures in a row stop a training run in one line.

The faults are real: an env whose step or reset blocks until it is closed (tests/stuck_envs.py), an engine
call that never returns, an agent whose tool blocks forever."""

import threading
import time

import openai
import pytest
from procs import sleuth_here
from stuck_envs import CLOSED_WHILE_STUCK, HangingDocRead

import sleuth
from sleuth.agents.gateway import Gateway, create_app
from sleuth.agents.gateway.agent_runner import run_agent_episodes
from sleuth.agents.loop.episodes import run_episodes
from sleuth.agents.loop.steps import EnvSteps
from sleuth.agents.policies.base import Generation, SamplingParams
from sleuth.agents.policies.load import load_policy
from sleuth.core.net import in_thread
from sleuth.training.config import load_config


def _eventually(pred, timeout=5.0):
    end = time.time() + timeout
    while not pred() and time.time() < end:
        time.sleep(0.01)
    return pred()


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("hang", ["step", "reset"])
def test_an_episode_stuck_in_its_env_fails_as_a_timeout_its_env_closed_and_the_others_finish(hotpot_tasks, workers,
                                                                                            hang):
    tasks = hotpot_tasks[:3]
    stuck = tasks[1].id
    t0 = time.perf_counter()
    trajs = {t.task_id: t for t in run_episodes(lambda: HangingDocRead(hang, [stuck], harness="text"), tasks,
                                                load_policy("oracle"), concurrency=3, env_threads=workers,
                                                episode_timeout_s=3.0)}
    assert time.perf_counter() - t0 < 12
    t = trajs[stuck]
    assert t.failed and t.stop_reason == "timeout" and "rollout.episode_timeout_s (3 s)" in t.error
    assert (len(t.turns) == 1) if hang == "step" else not t.turns  # the turn it generated before its step hung
    assert all(trajs[k].reward == 1.0 and not trajs[k].failed for k in trajs if k != stuck)
    if hang == "step":  # the loop closed the env, which released the stuck step (a reset stuck in
        assert _eventually(lambda: stuck in CLOSED_WHILE_STUCK)  # `reset` has no env to close yet: it stays)


class StuckEngine:
    """The oracle, except that a call for `stuck`'s task never returns (an engine server that stopped
    answering); four calls may run at once, as on a server."""

    parallel_calls = 4

    def __init__(self, stuck: str):
        self.inner, self.stuck = load_policy("oracle"), stuck
        self.tokenizer, self.name, self.version, self.max_context = self.inner.tokenizer, "stuck", 0, None
        self.release = threading.Event()

    def generate(self, requests, sampling):
        if any(r.task.id == self.stuck for r in requests):
            self.release.wait()
        return self.inner.generate(requests, sampling)


def test_an_episode_whose_generation_never_returns_times_out_and_the_others_finish(hotpot_tasks):
    tasks = hotpot_tasks[:3]
    engine = StuckEngine(tasks[0].id)
    try:
        trajs = {t.task_id: t for t in run_episodes(lambda: sleuth.make("DocRead-v0", harness="text"), tasks, engine,
                                                    concurrency=3, episode_timeout_s=1.0)}
    finally:
        engine.release.set()
    assert trajs[tasks[0].id].stop_reason == "timeout" and not trajs[tasks[0].id].turns
    assert trajs[tasks[1].id].reward == trajs[tasks[2].id].reward == 1.0


def test_env_steps_replace_a_thread_given_up_on_and_keep_their_width():
    hold = threading.Event()

    earlier = set(threading.enumerate())  # threads of earlier tests may retire meanwhile: count only new ones

    def ours():
        return sum(t.name == "sleuth-env" and t.is_alive() and t not in earlier for t in threading.enumerate())

    steps = EnvSteps(1)
    stuck = steps.submit(lambda: hold.wait() and "late")
    assert not _eventually(stuck.done, 0.2)
    steps.release(stuck)
    assert steps.released == 1 and ours() == 2
    assert steps.submit(lambda: "next").result(timeout=5) == "next"  # a new thread took the stuck one's place
    hold.set()  # the stuck call returns at last: its outcome arrives, its thread retires, the width stays one
    assert stuck.result(timeout=5) == "late"
    assert _eventually(lambda: ours() == 1)
    steps.close()
    assert _eventually(lambda: ours() == 0)


class Writes:
    """An engine that answers every call with `text` (one call at a time, as a model in the process)."""

    name, version, parallel_calls, max_context = "writes", 0, 1, None

    def __init__(self, tokenizer, text):
        self.tokenizer, self.text = tokenizer, text

    def generate(self, requests, sampling):
        ids = self.tokenizer.encode(self.text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return [Generation(ids, [-0.1] * len(ids), self.text) for _ in requests]


def test_an_agent_whose_tool_never_returns_fails_as_a_timeout_and_its_late_calls_are_refused(hotpot_tasks,
                                                                                              tokenizer):
    """A user's agent calls the gateway once, then waits on a tool that never returns: the episode is one failed
    `timeout` record at the deadline; when the tool comes back at last, the agent's next call is refused."""
    hung = threading.Event()
    late: list[BaseException] = []

    def agent(task, base_url):
        client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task["question"]}])
        if task["id"] == hotpot_tasks[0].id:
            hung.wait()  # the tool
            try:
                client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "again"}])
            except openai.BadRequestError as e:
                late.append(e)
        return "Paris"

    gateway = Gateway(Writes(tokenizer, "Answer: Paris"), SamplingParams(max_tokens=16))
    with in_thread(create_app(gateway)) as url:
        t0 = time.perf_counter()
        trajs = list(run_agent_episodes(agent, hotpot_tasks[:2], gateway, url, "qa", concurrency=2, timeout_s=2.0))
        assert time.perf_counter() - t0 < 15
        [stuck] = [t for t in trajs if t.task_id == hotpot_tasks[0].id]
        assert stuck.failed and stuck.stop_reason == "timeout" and "episode_timeout_s (2 s)" in stuck.error
        assert [t.failed for t in trajs if t.task_id == hotpot_tasks[1].id] == [False]
        hung.set()
        assert _eventually(lambda: bool(late)) and "has ended: the episode ran past" in str(late[0])
    assert not gateway._sessions  # nothing left open, the late call recorded nothing


def test_episode_timeout_and_failure_limit_are_checked_when_the_config_loads():
    with pytest.raises(ValueError, match="rollout.episode_timeout_s must be > 0"):
        load_config(overrides={"rollout.episode_timeout_s": 0})
    with pytest.raises(ValueError, match="rollout.max_consecutive_failures must be ≥ 0"):
        load_config(overrides={"rollout.max_consecutive_failures": -1})
    assert load_config(overrides={"rollout.episode_timeout_s": None}).rollout.episode_timeout_s is None


def test_a_run_whose_episodes_keep_getting_stuck_stops_in_one_line_after_the_limit(tiny_model_dir, tmp_path,
                                                                                  capfd):
    """Every episode's env hangs in its first step: each times out after 1 s, the step's groups are sampled once
    more, and the run stops at the limit in one line that names the failure and says to resume. `sleuth train`
    runs in this process, as the command line runs it (its imports loaded: seconds, not a new interpreter's
    startup); its envs, given up on, are released when closed."""
    args = ["--out", tmp_path / "run", "--set", f"model={tiny_model_dir}", "--set", "env=stuck_envs:HangingDocRead",
            "--set", "env_args={harness: text, hang: step}", "--set", "task_limit=8", "--set", "rollout.max_tokens=8",
            "--set", "rollout.group_size=2", "--set", "rollout.episode_timeout_s=1",
            "--set", "rollout.max_consecutive_failures=3", "--set", "rollout.outage_retries=0",
            "--set", "checkpoint.export_hf=false",
            "--set", "tensorboard=false", "--max-steps", "2"]
    t0 = time.perf_counter()
    run = sleuth_here("train", *args, capfd=capfd)
    stderr = run.stderr
    assert run.returncode == 1 and "Traceback" not in stderr, stderr[-3000:]
    [line] = [x for x in stderr.splitlines() if x.startswith("error:")]
    assert line.startswith("error: step 1: 3 episodes in a row failed for infrastructure reasons "
                           "(rollout.max_consecutive_failures; the last: timeout: the episode ran past "
                           "rollout.episode_timeout_s (1 s)")
    assert "rerun with --resume" in line
    assert time.perf_counter() - t0 < 120
