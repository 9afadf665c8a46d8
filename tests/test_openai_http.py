"""The OpenAI-compatible HTTP policy's handling of what a server returns (a real vLLM server is exercised
in test_trainer; here a stub transport produces the malformed answers a real one rarely gives)."""

import json

import httpx
import pytest

from sleuth.agents.openai_http import OpenAICompletionsPolicy, ServerError
from sleuth.agents.policy import Request, SamplingParams


def policy(tokenizer, handler):
    p = OpenAICompletionsPolicy("http://engine", "m", tokenizer)
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
