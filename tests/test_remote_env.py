"""Envs behind HTTP: sessions, limits, faults, and the agent loop spread over several servers."""

import os
import signal
import time

import httpx
import pytest

import sleuth
from sleuth.agents.loop.episodes import run_episodes
from sleuth.agents.policies.load import load_policy
from sleuth.core.net import free_port, in_thread, retry_counts, subprocess_server
from sleuth.envs.outcome import reset_info, step_info, wire
from sleuth.envs.remote import RemoteEnv, RemoteEnvError
from sleuth.servers.env import create_app


def test_sessions_limits_and_errors(hotpot_tasks):
    with in_thread(create_app("sleuth/DocRead-v0", max_sessions=2)) as url:
        a = httpx.post(f"{url}/sessions", json={}).json()["session_id"]
        httpx.post(f"{url}/sessions", json={"kwargs": {"harness": "text"}})
        full = httpx.post(f"{url}/sessions", json={})
        assert full.status_code == 429 and "limit of 2" in full.json()["detail"]
        assert httpx.post(f"{url}/sessions/{a}/step", json={"action": "read 1"}).status_code == 409
        assert httpx.post(f"{url}/sessions/nope/reset", json={"task": hotpot_tasks[0].to_dict()}).status_code == 404
        assert httpx.post(f"{url}/sessions/{a}/reset", json={"task": {"id": "x"}}).status_code == 422
        assert httpx.post(f"{url}/sessions/{a}/step", json={"wrong": 1}).status_code == 422
        assert httpx.delete(f"{url}/sessions/{a}").status_code == 200
        assert httpx.get(f"{url}/health").json()["sessions"] == 1
        bad = httpx.post(f"{url}/sessions", json={"kwargs": {"colour": "blue"}})
        assert bad.status_code == 422 and "colour" in bad.json()["detail"]
        huge = httpx.post(f"{url}/sessions", content=b"x" * (5 * 1024 * 1024),
                          headers={"content-type": "application/json"})
        assert huge.status_code == 413


def test_idle_sessions_are_reaped():
    with in_thread(create_app("sleuth/DocRead-v0", session_timeout_s=0.3)) as url:
        sid = httpx.post(f"{url}/sessions", json={}).json()["session_id"]
        time.sleep(1.0)
        assert httpx.get(f"{url}/health").json()["sessions"] == 0
        assert httpx.post(f"{url}/sessions/{sid}/step", json={"action": "x"}).status_code == 404


def test_remote_env_behaves_like_the_local_one(hotpot_tasks):
    with in_thread(create_app("sleuth/DocRead-v0")) as url:
        remote = sleuth.make("Remote-v0", url=url, harness="json")
        local = sleuth.make("DocRead-v0", harness="json")
        task = hotpot_tasks[0]
        def wired(result):  # the local env's typed info as the wire carries it
            *head, info = result
            return (*head, wire(info))

        assert remote.reset(options={"task": task}) == wired(local.reset(options={"task": task}))
        for action in ['<tool_call>{"name": "read", "arguments": {"doc": 7}}</tool_call>', "junk",
                       '<tool_call>{"name": "answer", "arguments": {"text": "Denise Levertov"}}</tool_call>']:
            assert remote.step(action) == wired(local.step(action))
        remote.close()


def test_agent_loop_spreads_episodes_over_two_servers(hotpot_tasks):
    with in_thread(create_app("sleuth/DocRead-v0")) as a, in_thread(create_app("sleuth/DocRead-v0")) as b:
        for workers in (0, 4):  # steps in turn, and in threads
            trajs = list(run_episodes(lambda: RemoteEnv(f"{a},{b}"), hotpot_tasks[:8], load_policy("oracle"),
                                      concurrency=4, env_threads=workers))
            assert len(trajs) == 8 and all(t.reward == 1.0 for t in trajs)
        served = [httpx.get(f"{u}/health").json() for u in (a, b)]
        assert all(h["status"] == "ok" for h in served)


class KillsServer:
    """Test double around the oracle: kills the env server after the first round of generation."""

    def __init__(self, proc):
        self.inner, self.proc, self.calls = load_policy("oracle"), proc, 0
        self.name, self.version, self.tokenizer, self.max_context = "oracle", 0, self.inner.tokenizer, None
        self.parallel_calls = 1

    def generate(self, requests, sampling):
        self.calls += 1
        if self.calls == 2:
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.inner.generate(requests, sampling)


def test_a_killed_server_truncates_episodes_and_loses_none(hotpot_tasks):
    with subprocess_server(["env", "--env", "sleuth/DocRead-v0"]) as (url, proc):
        start = time.perf_counter()
        trajs = list(run_episodes(lambda: RemoteEnv(url, timeout=5, retries=1), hotpot_tasks[:4],
                                  KillsServer(proc), concurrency=2))
        assert time.perf_counter() - start < 30  # no hang
    assert sorted(t.task_id for t in trajs) == sorted(t.id for t in hotpot_tasks[:4])
    broken = [t for t in trajs if t.stop_reason == "env_error"]
    assert len(broken) == 2 and all(t.failed and "unreachable" in t.error for t in broken)
    assert all("reset failed" in t.error for t in trajs if t.stop_reason == "reset_error")


def test_remote_env_errors_are_clear():
    with pytest.raises(ValueError, match="url"):
        RemoteEnv("")
    env = RemoteEnv(f"http://127.0.0.1:{free_port()}", timeout=1, retries=0)
    with pytest.raises(RemoteEnvError, match="unreachable"):
        env.reset(options={"task": {"id": "x", "question": "q"}})


def test_a_reset_by_seed_plays_the_episode_the_env_plays_in_process():
    """No task, a seed: the env on the server takes it as in process (a family env's seed is its episode), in the
    sync and async clients, and a session's resets follow the seeds as the env's own do. An env that needs a task
    says so itself."""
    import asyncio

    from sleuth.envs.remote import AsyncRemoteEnv

    async def async_reset(url):
        env = AsyncRemoteEnv(url)
        out = await env.reset(seed=2)
        await env.aclose()
        return out

    with in_thread(create_app("reasoning_gym:chain_sum")) as url:
        remote, local = RemoteEnv(url), sleuth.make("reasoning_gym:chain_sum")
        for seed in (2, 7, 2):
            obs, info = local.reset(seed=seed)
            assert remote.reset(seed=seed) == (obs, wire(info))
        obs, info = local.reset(seed=2)
        assert asyncio.run(async_reset(url)) == (obs, wire(info))
        remote.close()
    with in_thread(create_app("sleuth/DocRead-v0")) as url:
        with pytest.raises(RemoteEnvError, match=r"reset needs options=\{'task': Task\}"):
            RemoteEnv(url).reset(seed=2)


def test_a_family_server_builds_each_sessions_own_env_of_that_family():
    """`--env FAMILY:*`: each session names its env (sync and async clients), plays it as in process, and a session
    that names none, or an env of another family, is refused; so is an env another server does not serve."""
    import asyncio

    from sleuth.envs.registry import UnknownEnvError
    from sleuth.envs.remote import AsyncRemoteEnv

    async def async_reset(url):
        env = AsyncRemoteEnv(url, env_id="reasoning_gym:basic_arithmetic")
        out = await env.reset(seed=3)
        await env.aclose()
        return out

    with in_thread(create_app("reasoning_gym:*")) as url:
        assert httpx.get(f"{url}/health").json()["env"] == "reasoning_gym:*"
        for env_id in ("reasoning_gym:chain_sum", "reasoning_gym:basic_arithmetic"):
            remote, local = RemoteEnv(url, env_id=env_id), sleuth.make(env_id)
            obs, info = local.reset(seed=3)
            assert remote.reset(seed=3) == (obs, wire(info))
            remote.close()
        obs, info = sleuth.make("reasoning_gym:basic_arithmetic").reset(seed=3)
        assert asyncio.run(async_reset(url)) == (obs, wire(info))
        for body in ({}, {"env": "gem:game:GuessTheNumber-v0-easy"}):
            refused = httpx.post(f"{url}/sessions", json=body)
            assert refused.status_code == 422 and "name one as `env`" in refused.json()["detail"]
        with pytest.raises(RemoteEnvError, match="cannot build reasoning_gym:no_such_task") as bad:
            RemoteEnv(url, env_id="reasoning_gym:no_such_task").reset(seed=0)
        assert bad.value.status == 422 and bad.value.detail.startswith("cannot build reasoning_gym:no_such_task: ")
    with in_thread(create_app("reasoning_gym:chain_sum")) as url:
        with pytest.raises(RemoteEnvError, match="serves reasoning_gym:chain_sum, not reasoning_gym:basic_arithmetic"):
            RemoteEnv(url, env_id="reasoning_gym:basic_arithmetic").reset(seed=0)
    with pytest.raises(UnknownEnvError, match="no env family 'nope'"):
        create_app("nope:*")


def test_async_remote_env_runs_concurrent_episodes(hotpot_tasks):
    import asyncio

    from sleuth.envs.remote import AsyncRemoteEnv

    async def episode(url, task):
        env = AsyncRemoteEnv(url, harness="text")
        obs, info = await env.reset(options={"task": task})
        assert reset_info(info).format == "text"
        _, reward, terminated, _, _ = await env.step(f"answer: {task.answer}")
        await env.aclose()
        return reward, terminated

    async def main(url):
        return await asyncio.gather(*(episode(url, t) for t in hotpot_tasks[:6]))

    with in_thread(create_app("sleuth/DocRead-v0")) as url:
        results = asyncio.run(main(url))
    assert results == [(1.0, True)] * 6


def test_a_failed_reset_leaves_the_session_usable_and_bad_fields_are_named(hotpot_tasks):
    with in_thread(create_app("sleuth/DocRead-v0")) as url:
        sid = httpx.post(f"{url}/sessions", json={"kwargs": {"harness": "text"}}).json()["session_id"]
        assert httpx.post(f"{url}/sessions/{sid}/reset", json={"task": hotpot_tasks[0].to_dict()}).status_code == 200
        bad = {**hotpot_tasks[1].to_dict(), "answer": 123}
        r = httpx.post(f"{url}/sessions/{sid}/reset", json={"task": bad})
        assert r.status_code == 422 and "task field 'answer' must be a string" in r.json()["detail"]
        nodocs = {**hotpot_tasks[1].to_dict(), "payload": {}}
        assert httpx.post(f"{url}/sessions/{sid}/reset", json={"task": nodocs}).status_code == 422
        # the earlier episode is gone (409, not a 500), and the next good reset works
        assert httpx.post(f"{url}/sessions/{sid}/step", json={"action": "read 1"}).status_code == 409
        assert httpx.post(f"{url}/sessions/{sid}/reset", json={"task": hotpot_tasks[1].to_dict()}).status_code == 200
        assert httpx.post(f"{url}/sessions/{sid}/step", json={"action": "read 1"}).status_code == 200


def test_a_failed_reset_leaves_a_local_env_reusable(hotpot_tasks):
    import pytest

    import sleuth
    from sleuth.tasks import Task

    env = sleuth.make("DocRead-v0", harness="text")
    with pytest.raises(ValueError, match="no payload"):
        env.reset(options={"task": Task("x", "q?", "a")})
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("read 0")
    env.reset(options={"task": hotpot_tasks[0]})
    assert step_info(env.step("read 0")[4]).error is None


def _chunks(total_mb: int):
    for _ in range(total_mb):
        yield b"x" * (1024 * 1024)


def test_every_server_refuses_a_chunked_body_over_its_limit_without_reading_it_whole(tmp_path):
    """No Content-Length (chunked transfer): the limit is enforced on the bytes as they arrive."""
    from sleuth.servers.env import create_app as env_app
    from sleuth.servers.verifier import create_app as verifier_app

    for app, path in ((env_app("sleuth/DocRead-v0"), "/sessions"), (verifier_app("qa"), "/score")):
        with in_thread(app) as url:
            r = httpx.post(f"{url}{path}", content=_chunks(50), headers={"content-type": "application/json"},
                           timeout=60)
            assert r.status_code == 413 and "request body over" in r.json()["detail"]
            assert httpx.get(f"{url}/health").status_code == 200  # still serving


def test_episodes_wait_for_a_free_session_on_a_server_at_its_limit(hotpot_tasks):
    """`sleuth serve env --max-sessions 2` and six episodes at once: the server's 429s are waited out (an env
    between episodes gives its session up while others wait), none fails, and the refusals are counted."""
    before = retry_counts()["env_session"]
    with in_thread(create_app("sleuth/DocRead-v0", max_sessions=2)) as url:
        with pytest.warns(UserWarning, match="refused a session while this process held 2"):
            trajs = list(run_episodes(lambda: RemoteEnv(url, backoff_s=0.05), hotpot_tasks[:6], load_policy("oracle"),
                                      concurrency=6, episode_timeout_s=120))
        assert len(trajs) == 6 and not [t.error for t in trajs if t.failed] and all(t.reward == 1.0 for t in trajs)
        assert retry_counts()["env_session"] > before
        assert httpx.get(f"{url}/health").json()["sessions"] == 0  # every env closed: nothing left open
