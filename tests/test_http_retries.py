"""Retries with backoff for transient HTTP failures (`net.send_with_retries`), against real servers and real
faults: a refused port, a server that answers 503 for a while, a server that starts late, and a proxy that
closes the connection after the server has answered (the answer is lost, the request was carried out)."""

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import httpx
import pytest

import sleuth
from sleuth.core.net import (
    RetriesExhausted,
    free_port,
    in_thread,
    retry_after_s,
    retry_counts,
    send_with_retries,
    wait_healthy,
)
from sleuth.envs.outcome import wire
from sleuth.envs.remote import AsyncRemoteEnv, RemoteEnv, RemoteEnvError
from sleuth.servers.env import create_app


def flaky_app(failures: int, status: int = 503, retry_after: str | None = None):
    """A FastAPI app whose `/x` answers `status` to its first `failures` requests, then 200."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    app, seen = FastAPI(), []

    @app.get("/health")
    def health():
        return {"status": "ok"}

    @app.get("/x")
    def x():
        seen.append(time.monotonic())
        if len(seen) <= failures:
            headers = {"Retry-After": retry_after} if retry_after is not None else None
            return JSONResponse({"detail": "busy"}, status, headers=headers)
        return {"ok": len(seen)}

    app.state.seen = seen
    return app


def retried(kind: str, before: dict[str, int]) -> int:
    return retry_counts()[kind] - before[kind]


def test_transient_answers_are_retried_with_backoff_and_counted():
    app = flaky_app(2)
    with in_thread(app) as url, httpx.Client() as client:
        before = retry_counts()
        resp = send_with_retries(lambda: client.get(f"{url}/x"), kind="verifier", what="GET /x", retries=3,
                                 backoff_s=0.1)
    assert resp.status_code == 200 and resp.json() == {"ok": 3}
    assert retried("verifier", before) == 2
    gaps = [b - a for a, b in zip(app.state.seen, app.state.seen[1:], strict=False)]
    assert 0.05 <= gaps[0] < 2 and 0.1 <= gaps[1] < 2  # 0.1 then 0.2 s, each half jittered


def test_retry_after_is_honoured():
    app = flaky_app(1, status=429, retry_after="1")
    with in_thread(app) as url, httpx.Client() as client:
        resp = send_with_retries(lambda: client.get(f"{url}/x"), kind="env", what="GET /x", retries=1, backoff_s=0)
    assert resp.status_code == 200 and app.state.seen[1] - app.state.seen[0] >= 0.95
    in_a_while = httpx.Response(503, headers={"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})
    assert retry_after_s(in_a_while) == 0.0  # a date in the past: now
    assert retry_after_s(httpx.Response(503, headers={"Retry-After": "soon"})) is None


def test_retries_are_bounded_and_the_last_answer_or_failure_comes_back():
    app = flaky_app(10)
    with in_thread(app) as url, httpx.Client() as client:
        before = retry_counts()
        resp = send_with_retries(lambda: client.get(f"{url}/x"), kind="rollout", what="GET /x", retries=2,
                                 backoff_s=0.01)
        assert resp.status_code == 503 and len(app.state.seen) == 3 and retried("rollout", before) == 2
        for status in (500, 404):  # a server's bug or the caller's mistake: repeating changes nothing
            once = flaky_app(1, status=status)
            with in_thread(once) as url2:
                r = send_with_retries(lambda u=url2: client.get(f"{u}/x"), kind="rollout", what="x", retries=3,
                                      backoff_s=0.01)
            assert r.status_code == status and len(once.state.seen) == 1
    dead = f"http://127.0.0.1:{free_port()}"
    before, start = retry_counts(), time.monotonic()
    with httpx.Client() as client, pytest.raises(RetriesExhausted, match=r"POST /y: ConnectError: .*after 3 tries"):
        send_with_retries(lambda: client.post(f"{dead}/y"), kind="retrieval", what="POST /y", retries=2,
                          backoff_s=0.01)
    assert retried("retrieval", before) == 2 and time.monotonic() - start < 5
    with pytest.raises(ValueError, match="unknown retry kind"):
        send_with_retries(lambda: None, kind="database", what="x", retries=1, backoff_s=0)


def test_retry_counts_names_every_kind():
    counts = retry_counts()
    assert set(counts) == {"env", "rollout", "verifier", "retrieval", "teacher", "env_session"}
    assert all(v >= 0 for v in counts.values())


class LosesAnswers:
    """A TCP proxy in front of `upstream` (host, port). The first `drops` requests whose first line contains
    `marker` are passed on and answered by the server, and then the client's connection is closed without
    that answer: the request was carried out, its answer lost on the way back."""

    def __init__(self, upstream: str, marker: bytes, drops: int = 1):
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream, self.marker, self.drops, self.dropped = (host, int(port)), marker, drops, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    @staticmethod
    def _message(conn: socket.socket, buf: bytearray) -> bytes | None:
        """One HTTP/1.1 message (head and Content-Length body) off `conn`; None when it closes."""
        while b"\r\n\r\n" not in buf:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            buf += chunk
        head, _, _ = bytes(buf).partition(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        size = len(head) + 4 + length
        while len(buf) < size:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            buf += chunk
        message = bytes(buf[:size])
        del buf[:size]
        return message

    def _relay(self, client: socket.socket) -> None:
        with client, socket.create_connection(self.upstream) as server:
            from_client, from_server = bytearray(), bytearray()
            while (request := self._message(client, from_client)) is not None:
                server.sendall(request)
                answer = self._message(server, from_server)
                if answer is None:
                    return
                if self.marker in request.split(b"\r\n", 1)[0] and self.dropped < self.drops:
                    self.dropped += 1
                    return  # both connections close here: the client never sees the answer
                client.sendall(answer)

    def close(self) -> None:
        self.sock.close()


READ = ['<tool_call>{"name": "read", "arguments": {"doc": 7}}</tool_call>',
        '<tool_call>{"name": "read", "arguments": {"doc": 2}}</tool_call>']


def test_a_step_whose_answer_is_lost_is_retried_and_taken_once(hotpot_tasks):
    """The retried step gets the first try's answer: the env stepped once (its read counter says so)."""
    task = hotpot_tasks[0]
    local = sleuth.make("DocRead-v0", harness="json")
    local.reset(options={"task": task})
    expected = [(*step[:4], wire(step[4])) for step in (local.step(a) for a in READ)]  # as the wire carries it
    with in_thread(create_app("sleuth/DocRead-v0")) as url:
        proxy = LosesAnswers(url, b"/step")
        remote = RemoteEnv(proxy.url, harness="json", backoff_s=0.05)
        before = retry_counts()
        remote.reset(options={"task": task})
        assert [remote.step(a) for a in READ] == expected
        assert proxy.dropped == 1 and retried("env", before) == 1
        remote.close()
        proxy.close()


def test_the_async_remote_env_retries_a_lost_step_too(hotpot_tasks):
    task = hotpot_tasks[0]
    local = sleuth.make("DocRead-v0", harness="json")
    local.reset(options={"task": task})
    expected = [[*step[:4], wire(step[4])] for step in (local.step(a) for a in READ)]

    async def episode(url):
        env = AsyncRemoteEnv(url, harness="json", backoff_s=0.05)
        await env.reset(options={"task": task})
        out = [list(await env.step(a)) for a in READ]
        await env.aclose()
        return out

    with in_thread(create_app("sleuth/DocRead-v0")) as url:
        proxy = LosesAnswers(url, b"/step")
        assert asyncio.run(episode(proxy.url)) == expected and proxy.dropped == 1
        proxy.close()


def test_a_server_that_starts_late_is_waited_for(hotpot_tasks):
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app("sleuth/DocRead-v0"), host="127.0.0.1", port=port,
                                           log_level="error"))
    late = threading.Timer(0.6, server.run)
    late.daemon = True
    env = RemoteEnv(f"http://127.0.0.1:{port}", harness="text", retries=6, backoff_s=0.1)
    before = retry_counts()
    late.start()
    try:
        obs, _ = env.reset(options={"task": hotpot_tasks[0]})
        assert "Documents:" in obs and retried("env", before) >= 1
    finally:
        env.close()
        server.should_exit = True
        late.join(5)


def test_a_dead_env_server_fails_with_the_same_error_after_bounded_retries():
    env = RemoteEnv(f"http://127.0.0.1:{free_port()}", retries=2, backoff_s=0.05, timeout=1)
    before, start = retry_counts(), time.monotonic()
    with pytest.raises(RemoteEnvError,
                       match=r"unreachable: POST /sessions: ConnectError: .*gave up after 3 tries") as e:
        env.reset(options={"task": {"id": "x", "question": "q"}})
    assert retried("env", before) == 2 and time.monotonic() - start < 5
    assert "\n" not in str(e.value)


def test_remote_env_draws_from_tasks_as_the_local_envs_do(hotpot_tasks):
    from gymnasium.utils.env_checker import check_env

    tasks = hotpot_tasks[:5]
    local = sleuth.make("DocRead-v0", harness="text", tasks=tasks)
    with in_thread(create_app("sleuth/DocRead-v0")) as url:
        remote = sleuth.make("Remote-v0", url=url, harness="text", tasks=tasks)
        for seed in (0, 1, 2, None):
            if seed is None:  # unseeded: drawn from the env's own generator, still one of the tasks
                assert remote.reset()[1]["task_id"] in {t.id for t in tasks}
            else:
                obs, info = local.reset(seed=seed)
                assert remote.reset(seed=seed) == (obs, wire(info))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(remote.unwrapped, skip_render_check=True)  # it resets without a task: drawn from tasks
        # any checker warning fails the test; a ResourceWarning is the garbage collector finding another test's
        # unclosed socket while the checker runs, not the checker's
        assert not [w for w in caught if not issubclass(w.category, ResourceWarning)], [str(w.message) for w in caught]
        remote.close()
        with pytest.raises(RemoteEnvError, match="answered 422: .*tasks=\\[...\\]"):  # the server's env says why
            sleuth.make("Remote-v0", url=url).reset()


def test_waiting_for_a_server_whose_process_died_stops_at_once():
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="exited with status 3"):
        wait_healthy(f"http://127.0.0.1:{free_port()}", timeout_s=60, proc=proc)
    assert time.monotonic() - start < 10


def flaky_retrieval(failures: int):
    """A server with the retrieval server's /search answer, 503 to its first `failures` searches."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    app, seen = FastAPI(), []

    @app.get("/health")
    def health():
        return {"status": "ok"}

    @app.post("/search")
    def search():
        seen.append(1)
        if len(seen) <= failures:
            return JSONResponse({"detail": "warming up"}, 503)
        return {"results": [[{"id": "d1", "score": 2.5}]]}

    return app


def test_the_retrieval_clients_retry_through_the_shared_helper():
    from sleuth.envs.retrieval.client import AsyncRetrievalClient, RetrievalClient, RetrievalError

    with in_thread(flaky_retrieval(2)) as url:
        before = retry_counts()
        with RetrievalClient(url, retries=3, backoff=0.01) as client:
            assert [h.id for h in client.search(["q"])[0]] == ["d1"]
        assert retried("retrieval", before) == 2
    with in_thread(flaky_retrieval(1)) as url:
        client = AsyncRetrievalClient(url, retries=2, backoff=0.01)

        async def search():
            try:
                return await client.search(["q"])
            finally:
                await client.aclose()

        assert [h.id for h in asyncio.run(search())[0]] == ["d1"]
    with in_thread(flaky_retrieval(5)) as url, RetrievalClient(url, retries=1, backoff=0.01) as client:
        with pytest.raises(RetrievalError, match=r"failed after 2 tries: .*/search answered 503"):
            client.search(["q"])


def test_train_with_a_dead_vllm_url_says_what_to_do_in_one_line(tiny_model_dir, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    cmd = [sys.executable, "-m", "sleuth.cli", "train", "--config", "configs/docread_quick.yaml", "--out",
           str(tmp_path / "run"), "--set", f"model={tiny_model_dir}", "--set", "rollout.inference=vllm",
           "--set", f"rollout.vllm_url={url}"]
    env = {**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1"}  # transformers' "Loading weights" bar is not an error
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[1], env=env)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot reach the vLLM server at {url}: "), r.stderr
    assert "Connection refused" in lines[0] and "gave up after 4 tries" in lines[0]
    assert "--worker-extension-cls sleuth_vllm_ext.WeightLoader" in lines[0] and "fix rollout.vllm_url" in lines[0]
