"""Several servers behind one policy: a task sticks to its server (prefix-cache hits for its group and
its turns), new tasks go to the least-loaded server, answers come back in request order."""

import threading

import pytest

from sleuth.agents.policies.base import Generation, Request, SamplingParams
from sleuth.agents.policies.routing import RoutedPolicy
from sleuth.tasks import Task


class Server:
    """Answers with its own number; `hold` blocks its calls until released (requests stay outstanding)."""

    tokenizer, version, parallel_calls = None, 0, 8

    def __init__(self, number, max_context=None, fail=False):
        self.number, self.max_context, self.fail, self.name = number, max_context, fail, f"s{number}"
        self.seen, self.hold, self.closed = [], threading.Event(), False
        self.hold.set()

    def generate(self, requests, sampling):
        self.seen += [r.task.id if r.task else None for r in requests]
        self.hold.wait(5)
        if self.fail:
            raise ConnectionError(f"{self.name} is down")
        return [Generation([self.number], [0.0], str(self.number)) for _ in requests]

    def close(self):
        self.closed = True


def req(task_id, turn=0):
    return Request([1, 2], [], Task(id=task_id, question="q") if task_id else None, turn)


def test_a_task_sticks_to_its_server_and_answers_keep_their_order():
    a, b = Server(0), Server(1)
    p = RoutedPolicy([a, b])
    first = p.generate([req("x"), req("y"), req("x"), req("z")], SamplingParams())
    home = {t: p.home[t] for t in "xyz"}
    assert home["x"] != home["y"]  # the second new task went to the less loaded server
    assert [g.ids[0] for g in first] == [home["x"], home["y"], home["x"], home["z"]]
    later = p.generate([req("y", 1), req("x", 1), req("x", 2)], SamplingParams())  # later turns: same servers
    assert [g.ids[0] for g in later] == [home["y"], home["x"], home["x"]]
    assert p.outstanding == [0, 0] and p.parallel_calls == 16
    p.close()
    assert a.closed and b.closed


def test_new_tasks_go_to_the_server_with_fewest_outstanding_requests():
    a, b = Server(0), Server(1)
    p = RoutedPolicy([a, b])
    a.hold.clear()  # server 0 keeps three requests outstanding
    busy = threading.Thread(target=p.generate, args=([req("t1"), req("t2"), req("t3")], SamplingParams()))
    p.home.update({"t1": 0, "t2": 0, "t3": 0})
    busy.start()
    while p.outstanding[0] < 3:
        pass
    assert [g.ids[0] for g in p.generate([req("new1"), req("new2")], SamplingParams())] == [1, 1]
    a.hold.set()
    busy.join(5)
    assert p.generate([req(None)], SamplingParams())[0].ids == [0]  # no task: the least loaded now (a tie: first)


def test_a_failed_server_fails_the_call_and_frees_its_count():
    p = RoutedPolicy([Server(0, fail=True), Server(1, max_context=512)])
    assert p.max_context == 512
    with pytest.raises(ConnectionError, match="s0 is down"):
        p.generate([req("a"), req("b")], SamplingParams())
    assert p.outstanding == [0, 0]


def test_no_servers_is_an_error():
    with pytest.raises(ValueError, match="at least one server"):
        RoutedPolicy([])


def test_requests_a_dead_server_cannot_take_go_to_another(tokenizer):
    """A real dead port beside a real server: the dead one's requests are answered by the live one, whose
    tasks they become; one rollout retry counted per part moved."""
    from fastapi import FastAPI

    from sleuth.agents.policies.openai_http import OpenAICompletionsPolicy, ServerUnreachable
    from sleuth.core.net import free_port, in_thread, retry_counts

    app = FastAPI()
    app.get("/health")(lambda: {})
    app.post("/v1/completions")(lambda: {"choices": [{"finish_reason": "stop", "logprobs": {
        "tokens": [f"token_id:{tokenizer.eos_token_id}"], "token_logprobs": [-0.1]}}]})
    with in_thread(app) as url:
        dead = OpenAICompletionsPolicy(f"http://127.0.0.1:{free_port()}", "m", tokenizer, retries=0, max_context=64)
        live = OpenAICompletionsPolicy(url, "m", tokenizer, retries=0, max_context=64)
        p = RoutedPolicy([dead, live])
        p.home["a"] = 0  # task a lives on the dead server
        before = retry_counts()["rollout"]
        gens = p.generate([req("a"), req("b"), req("a", 1)], SamplingParams())
        assert [g.ids for g in gens] == [[tokenizer.eos_token_id]] * 3
        assert p.home["a"] == 1 and p.outstanding == [0, 0] and retry_counts()["rollout"] - before == 1
        alone = RoutedPolicy([OpenAICompletionsPolicy(f"http://127.0.0.1:{free_port()}", "m", tokenizer, retries=0,
                                                      max_context=64)])
        with pytest.raises(ServerUnreachable):
            alone.generate([req("c")], SamplingParams())
        for policy in (p, alone):
            policy.close()


def test_a_server_gone_for_good_gets_no_more_work():
    """A server that answers `ServerUnreachable(permanent=True)` (a Ray worker stopped for crash-looping) is routed
    around from then on: its requests move once, and later tasks never go to it."""
    from sleuth.agents.policies.base import Generation, Request, SamplingParams
    from sleuth.agents.policies.openai_http import ServerUnreachable
    from sleuth.agents.policies.routing import RoutedPolicy
    from sleuth.tasks.base import Task

    class Server:
        def __init__(self, name, dead=False):
            self.name, self.dead, self.calls = name, dead, 0
            self.tokenizer, self.max_context, self.parallel_calls, self.version = None, None, 1, 0

        def generate(self, requests, sampling):
            self.calls += 1
            if self.dead:
                raise ServerUnreachable(f"{self.name} is dead", permanent=True)
            return [Generation([1], [0.0], self.name) for _ in requests]

        def close(self):
            pass

    dead, live = Server("dead", dead=True), Server("live")
    router = RoutedPolicy([dead, live])
    req = lambda i: Request([1, 2], [], Task(f"t{i}", "q", "a"))  # noqa: E731
    assert [g.text for g in router.generate([req(0)], SamplingParams())] == ["live"]
    assert dead.calls == 1 and router.gone == {0}
    for i in range(1, 4):
        assert router.generate([req(i)], SamplingParams())[0].text == "live"
    assert dead.calls == 1
