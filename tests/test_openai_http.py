"""The OpenAI-compatible HTTP policy's handling of what a server returns (a real vLLM server is exercised
in test_trainer; here a stub transport produces the malformed answers a real one rarely gives, and small
real servers the busy answers, the dead port and the context length of `GET /v1/models`)."""

import json

import httpx
import pytest

from sleuth.agents.policies.base import Request, SamplingParams
from sleuth.agents.policies.openai_http import OpenAICompletionsPolicy, ServerError, ServerUnreachable
from sleuth.core.net import free_port, in_thread, retry_counts


def policy(tokenizer, handler):
    p = OpenAICompletionsPolicy("http://engine", "m", tokenizer, backoff_s=0.01)
    p.client = httpx.Client(transport=httpx.MockTransport(handler))
    return p


def ok(ids, finish="stop"):
    return {"choices": [{"finish_reason": finish, "logprobs": {"tokens": [f"token_id:{i}" for i in ids],
                                                               "token_logprobs": [-0.5] * len(ids)}}]}


def test_ids_logprobs_and_distinct_seeds(tokenizer):
    seen = []

    def handler(req):
        body = json.loads(req.content)
        seen.append(body)
        return httpx.Response(200, json=ok([28, 29, tokenizer.eos_token_id]))

    gens = policy(tokenizer, handler).generate([Request([1, 2, 3], [], None)] * 3,
                                               SamplingParams(max_tokens=5, temperature=1.0, seed=7))
    assert gens[0].ids == [28, 29, tokenizer.eos_token_id] and gens[0].logprobs == [-0.5] * 3
    assert gens[0].finish_reason == "stop"
    assert all(b["prompt"] == [1, 2, 3] and b["return_tokens_as_token_ids"] for b in seen)
    assert len({b["seed"] for b in seen}) == 3  # equal seeds would make a group's samples identical


@pytest.mark.parametrize("response, message", [
    (httpx.Response(500, text="engine died"), "answered 500: engine died"),
    (httpx.Response(200, json={"choices": [{"finish_reason": "stop", "logprobs": {"tokens": ["Hello"],
                                                                                  "token_logprobs": [-1]}}]}),
     "no token ids"),
])
def test_bad_answers_are_clear_errors(tokenizer, response, message):
    p = policy(tokenizer, lambda req: response)
    with pytest.raises(ServerError, match=message):
        p.generate([Request([1], [], None)], SamplingParams())


def test_unreachable_server(tokenizer):
    def handler(req):
        raise httpx.ConnectError("refused")

    with pytest.raises(ServerError, match="request to http://engine failed: ConnectError"):
        policy(tokenizer, handler).generate([Request([1], [], None)], SamplingParams())


def test_seeds_follow_the_episode_not_the_batch(tokenizer):
    """The continuous loop sends one request per call: the seed comes from the episode's index and turn."""
    seen = []

    def handler(req):
        seen.append(json.loads(req.content)["seed"])
        return httpx.Response(200, json=ok([tokenizer.eos_token_id]))

    p, s = policy(tokenizer, handler), SamplingParams(temperature=1.0, seed=7)
    for sample, turn in ((0, 0), (1, 0), (0, 1), (0, 0)):
        p.generate([Request([1], [], None, turn, sample=sample)], s)
    p.generate([Request([1], [], None, 0, sample=1), Request([1], [], None, 0, sample=0)], s)
    assert len(set(seen[:3])) == 3 and seen[3] == seen[0]  # distinct per (episode, turn), the same when repeated
    assert seen[4:] == [seen[1], seen[0]]  # the position in a batch does not matter


def engine_app(models, busy: int = 0):
    """A small OpenAI-compatible server: `GET /v1/models` answers `models`; `/v1/completions` answers 503
    to its first `busy` requests, then one end-of-turn token."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    app, seen = FastAPI(), {"models": 0, "completions": 0}

    @app.get("/health")
    def health():
        return {}

    @app.get("/v1/models")
    def list_models():
        seen["models"] += 1
        return {"object": "list", "data": models}

    @app.post("/v1/completions")
    def complete():
        seen["completions"] += 1
        if seen["completions"] <= busy:
            return JSONResponse({"detail": "overloaded"}, 503)
        return ok([0])

    app.state.seen = seen
    return app


def test_max_context_comes_from_the_servers_model_list(tokenizer):
    models = [{"id": "other", "max_model_len": 4096}, {"id": "m", "object": "model", "max_model_len": 2048}]
    app = engine_app(models)
    with in_thread(app) as url:
        p = OpenAICompletionsPolicy(url, "m", tokenizer)
        assert app.state.seen["models"] == 0  # asked when first read, not before
        assert p.max_context == 2048 and p.max_context == 2048 and app.state.seen["models"] == 1
        given = OpenAICompletionsPolicy(url, "m", tokenizer, max_context=100)
        assert given.max_context == 100 and app.state.seen["models"] == 1  # the caller's value is not asked for
        assert OpenAICompletionsPolicy(url, "nope", tokenizer).max_context is None  # not served: unknown
    with in_thread(engine_app([{"id": "served-name", "max_model_len": 512}])) as url:
        assert OpenAICompletionsPolicy(url, "m", tokenizer).max_context == 512  # the one model served
    with in_thread(engine_app([{"id": "m"}])) as url:  # a server that does not report it
        assert OpenAICompletionsPolicy(url, "m", tokenizer).max_context is None
    dead = OpenAICompletionsPolicy(f"http://127.0.0.1:{free_port()}", "m", tokenizer, retries=0)
    assert dead.max_context is None and not dead._context_known  # asked again on the next read


def test_a_busy_server_is_retried_and_a_dead_one_fails_after_the_bound(tokenizer):
    app = engine_app([], busy=2)
    with in_thread(app) as url:
        before = retry_counts()["rollout"]
        p = OpenAICompletionsPolicy(url, "m", tokenizer, backoff_s=0.01)
        assert p.generate([Request([1], [], None)], SamplingParams())[0].ids == [0]
        assert app.state.seen["completions"] == 3 and retry_counts()["rollout"] - before == 2
        still_busy = engine_app([], busy=10)
    with in_thread(still_busy) as url:
        p = OpenAICompletionsPolicy(url, "m", tokenizer, retries=1, backoff_s=0.01)
        with pytest.raises(ServerUnreachable, match="answered 503 to 2 tries"):
            p.generate([Request([1], [], None)], SamplingParams())
    dead = OpenAICompletionsPolicy(f"http://127.0.0.1:{free_port()}", "m", tokenizer, retries=2, backoff_s=0.01)
    with pytest.raises(ServerUnreachable, match="failed: ConnectError: .*gave up after 3 tries"):
        dead.generate([Request([1], [], None)], SamplingParams())
