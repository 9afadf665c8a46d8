"""The agent gateway through the real `openai` SDK: token-exact trajectories from an agent's calls (the same
invariant as the agent loop's), segments when the agent rewrites its history, and the API's odd corners."""

import json

import openai
import pytest

from sleuth.agents.gateway import Gateway, create_app
from sleuth.agents.policies.base import Generation, SamplingParams
from sleuth.core.net import in_thread

TOOLS = [{"type": "function", "function": {"name": "read", "description": "Read a document by number.",
                                            "parameters": {"type": "object", "properties": {"doc": {"type": "integer"}},
                                                           "required": ["doc"]}}}]


class Scripted:
    """Test double for the engine: replies with the next text of a script, as canonical ids ending with the
    end-of-turn token, and remembers every generation it returned (what the trajectory must hold)."""

    name, version, parallel_calls = "scripted", 3, 1

    def __init__(self, tokenizer, script, max_context=None):
        self.tokenizer, self.script, self.max_context = tokenizer, list(script), max_context
        self.returned: list[Generation] = []

    def generate(self, requests, sampling):
        out = []
        for _ in requests:
            text = self.script.pop(0)
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            out.append(Generation(ids, [-0.25 - 0.01 * k for k in range(len(ids))], text, "stop"))
        self.returned += out
        return out


def call(doc):
    return f'<tool_call>\n{json.dumps({"name": "read", "arguments": {"doc": doc}})}\n</tool_call>'


@pytest.fixture
def served(tokenizer):
    made = []

    def serve(script, **kw):
        policy = Scripted(tokenizer, script, kw.pop("max_context", None))
        gw = Gateway(policy, SamplingParams(max_tokens=32))
        cm = in_thread(create_app(gw, **kw))
        url = cm.__enter__()
        made.append(cm)
        return policy, gw, url

    yield serve
    for cm in made:
        cm.__exit__(None, None, None)


def client(url, session, key="anything"):
    return openai.OpenAI(base_url=f"{url}/s/{session}/v1", api_key=key, max_retries=0)


def test_three_tool_calls_record_the_sampled_ids_and_equal_the_template_of_the_whole_conversation(served, tokenizer):
    policy, gw, url = served([call(3), call(7), call(1), "The answer is Paris."])
    c = client(url, "ep")
    messages = [{"role": "system", "content": "Answer with the tools."}, {"role": "user", "content": "Capital?"}]
    for turn in range(4):
        reply = c.chat.completions.create(model="m", messages=messages, tools=TOOLS, logprobs=True)
        message = reply.choices[0].message
        messages.append(message)  # the SDK's own object, as agents append it
        if turn < 3:
            assert reply.choices[0].finish_reason == "tool_calls" and message.content is None
            assert json.loads(message.tool_calls[0].function.arguments) == {"doc": [3, 7, 1][turn]}
            messages.append({"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": f"doc {turn}"})
        assert len(reply.choices[0].logprobs.content) == len(policy.returned[-1].ids)
    episode = gw.end("ep")
    assert episode.calls == 4 and episode.splits == 0 and len(episode.segments) == 1
    traj = episode.segments[0]
    assert [t.action_ids for t in traj.turns] == [g.ids for g in policy.returned]  # the engine's own ids
    assert [t.action_logprobs for t in traj.turns] == [g.logprobs for g in policy.returned]
    assert [t.policy_version for t in traj.turns] == [3] * 4
    assert [t.tool_call for t in traj.turns][:3] == [{"name": "read", "arguments": {"doc": d}} for d in (3, 7, 1)]
    # the ids are the chat template of the whole conversation (tools in the system prompt, calls in the
    # assistant turns), but for the final terminator's trailing newline
    fmt = gw.format
    from sleuth.agents.gateway.render import normalise

    full = tokenizer.apply_chat_template(fmt.template_messages([normalise(m if isinstance(m, dict) else
                                                                          m.model_dump()) for m in messages], TOOLS),
                                         tokenize=False)
    assert tokenizer.decode(traj.token_ids()) + "\n" == full
    assert traj.token_ids() == tokenizer.encode(full, add_special_tokens=False)[:-1]
    mask = traj.loss_mask()
    policy_ids = [i for i, m in zip(traj.token_ids(), mask, strict=True) if m]
    assert policy_ids == [i for g in policy.returned for i in g.ids]  # nothing the env wrote is trained


def test_a_rewritten_history_starts_a_segment_and_no_segment_trains_env_tokens(served):
    policy, gw, url = served([call(1), call(2), "first answer", "Paris"])
    c = client(url, "rw")
    messages = [{"role": "user", "content": "Capital?"}]
    for _ in range(3):
        m = c.chat.completions.create(model="m", messages=messages, tools=TOOLS).choices[0].message
        messages.append(m.model_dump(exclude_none=True))
        if m.tool_calls:
            messages.append({"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "a long document " * 20})
    # the agent summarises: old tool results dropped, a new system prompt
    summary = [{"role": "system", "content": "Notes: the documents say Paris."},
               {"role": "user", "content": "Capital?"}]
    assert c.chat.completions.create(model="m", messages=summary).choices[0].message.content == "Paris"
    episode = gw.end("rw")
    assert episode.splits == 1 and [len(t.turns) for t in episode.segments] == [3, 1]
    sampled = [g.ids for g in policy.returned]
    assert [t.action_ids for s in episode.segments for t in s.turns] == sampled
    for seg in episode.segments:
        trained = [i for i, m in zip(seg.token_ids(), seg.loss_mask(), strict=True) if m]
        assert trained == [i for t in seg.turns for i in t.action_ids]
        assert len(seg.sampling_logprobs()) == len(seg.token_ids())


def test_streaming_n_stop_and_a_changed_tool_set(served):
    policy, gw, url = served(["Paris is the capital. END more", "Lyon", "Nice"])
    c = client(url, "s")
    msgs = [{"role": "user", "content": "Capital?"}]
    stream = c.chat.completions.create(model="m", messages=msgs, stream=True, stop=["END"],
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == "Paris is the capital. " and chunks[-1].usage.completion_tokens > 0
    two = c.chat.completions.create(model="m", messages=msgs, n=2, tools=TOOLS)
    assert [ch.message.content for ch in two.choices] == ["Lyon", "Nice"]
    episode = gw.end("s")
    assert episode.splits == 1 and episode.unused_choices == 1  # new tools: a new segment; "Nice" never carried
    cut = episode.segments[0].turns[0]
    assert tokenizer_text(policy, cut.action_ids).startswith("Paris is the capital. END")
    assert cut.action_ids[-1] != policy.tokenizer.eos_token_id  # cut at the stop string, as sampled so far


def tokenizer_text(policy, ids):
    return policy.tokenizer.decode(ids)


def test_a_prompt_over_the_context_is_refused_as_openai_does_and_a_wrong_key_is_401(served):
    _, gw, url = served(["x"], max_context=64, api_key="secret")
    with pytest.raises(openai.AuthenticationError):
        client(url, "k", key="wrong").chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError) as e:
        client(url, "k", key="secret").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "word " * 200}])
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client(url, "k", key="secret").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], temperature=-1)
    assert [m.id for m in client(url, "k", key="secret").models.list()] == ["scripted"]
    assert gw.end("k").calls == 0


def test_a_real_model_through_the_sdk_records_what_it_sampled(tiny_model_dir):
    from sleuth.agents.policies.hf import TransformersPolicy

    policy = TransformersPolicy(tiny_model_dir)
    returned = []
    generate = policy.generate
    policy.generate = lambda reqs, s: returned.extend(out := generate(reqs, s)) or out
    gw = Gateway(policy, SamplingParams(max_tokens=8, temperature=1.0, seed=0))
    with in_thread(create_app(gw)) as url:
        c = client(url, "real")
        msgs = [{"role": "user", "content": "Say hi."}]
        for _ in range(3):
            m = c.chat.completions.create(model="m", messages=msgs, logprobs=True).choices[0].message
            msgs += [m, {"role": "user", "content": "again"}]
    traj = gw.end("real").segments[0]
    assert [t.action_ids for t in traj.turns] == [g.ids for g in returned]
    assert [t.action_text for t in traj.turns] == [m.content for m in msgs[1::2]]  # every text the agent got
    assert all(len(t.action_ids) == len(t.action_logprobs) > 0 for t in traj.turns)


def test_sleuth_serve_gateway_records_sessions_for_a_client_in_any_language(tmp_path, tiny_model_dir):
    """Raw HTTP, as a program in another language would speak it; ending the session writes its trajectory."""
    import subprocess
    import sys

    import httpx

    from sleuth.core.net import free_port, wait_healthy

    refused = subprocess.run([sys.executable, "-m", "sleuth.cli", "serve", "gateway", "--host", "0.0.0.0"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "pass --api-key" in refused.stderr
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sleuth.cli", "serve", "gateway", "--policy", tiny_model_dir,
                             "--port", str(port), "--max-tokens", "6", "--out", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, 120)
        body = {"model": "any", "messages": [{"role": "user", "content": "hi"}]}
        reply = httpx.post(f"{url}/s/js-1/v1/chat/completions", json=body, timeout=60).json()
        assert reply["object"] == "chat.completion" and reply["usage"]["completion_tokens"] > 0
        ended = httpx.delete(f"{url}/s/js-1", timeout=60).json()
        assert ended == {"session": "js-1", "calls": 1, "segments": 1, "splits": 0, "unused_choices": 0}
    finally:
        proc.kill()
        proc.wait(10)
    lines = (tmp_path / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["meta"]["session"] == "js-1"


def test_an_engine_failure_is_a_503_and_fails_the_episode_even_if_the_agent_answers(served, hotpot_tasks):
    from sleuth.agents.gateway.agent_runner import run_agent_episodes

    _, gw, url = served(["first"])  # the script runs out at the second call: the engine raises

    def agent(task, base_url):
        c = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
        msgs = [{"role": "user", "content": task["question"]}]
        msgs.append(c.chat.completions.create(model="m", messages=msgs).choices[0].message)
        try:
            c.chat.completions.create(model="m", messages=[*msgs, {"role": "user", "content": "more"}])
        except openai.InternalServerError as e:
            assert e.status_code == 503
        return "Paris"  # an agent that swallows the failure still gets no score

    [traj] = list(run_agent_episodes(agent, hotpot_tasks[:1], gw, url, "qa", concurrency=1))
    assert traj.failed and traj.stop_reason == "engine_error" and "IndexError" in traj.error


def test_sessions_calling_at_once_share_one_engine_call(tokenizer):
    """A model in this process gets the calls of agents that are ready together as one batch, not one by one."""
    import threading

    policy = Scripted(tokenizer, ["a"] * 8)
    sizes = []
    generate = policy.generate
    policy.generate = lambda reqs, s: sizes.append(len(reqs)) or generate(reqs, s)
    gw = Gateway(policy, SamplingParams(max_tokens=4))
    for k in range(4):
        gw.begin(f"s{k}")
    threads = [threading.Thread(target=gw.complete, args=(f"s{k}", [{"role": "user", "content": str(k)}]))
               for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sizes == [4]
    gw.end("s0")  # three sessions open: a lone call waits at most the window for them, then goes alone
    gw.complete("s1", [{"role": "user", "content": "again"}])
    assert sizes == [4, 1]


def test_sessions_that_call_one_after_another_stop_paying_the_batching_window(tokenizer):
    import time

    from sleuth.agents.gateway.batching import MIN_WINDOW_S

    gw = Gateway(Scripted(tokenizer, ["a"] * 12), SamplingParams(max_tokens=4))
    for k in range(8):
        gw.begin(f"s{k}")  # eight open sessions, but only one ever calls
    took = []
    for k in range(10):
        start = time.perf_counter()
        gw.complete("s0", [{"role": "user", "content": str(k)}])
        took.append(time.perf_counter() - start)
    assert next(iter(gw._coalescers.values())).window == MIN_WINDOW_S
    assert sorted(took)[5] < 0.02  # the median call no longer waits the full 30 ms


def test_a_body_that_is_not_a_request_is_a_400_in_openais_shape(served):
    import httpx

    _, gw, url = served(["x"])
    for body in (b"not json", b"[1, 2]", b'{"messages": "hi"}', b'{"messages": [{"content": "no role"}]}'):
        r = httpx.post(f"{url}/s/b/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
    assert gw.end("b").calls == 0


def test_what_openai_refuses_is_a_400_naming_the_field_and_a_huge_body_is_refused_before_tokenising(served):
    import httpx

    _, gw, url = served(["x"], max_context=512)
    user = {"role": "user", "content": "hi"}
    for body, field in (({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
                        ({"messages": [user, {"role": "tool", "content": "r"}]}, "messages[1].tool_call_id"),
                        ({"messages": [user], "n": 0}, "n must be an integer ≥ 1")):
        r = httpx.post(f"{url}/s/b/v1/chat/completions", json=body)
        assert r.status_code == 400 and field in r.json()["error"]["message"], r.text

    def never(text):
        raise AssertionError("a prompt that cannot fit was tokenised")

    gw.renderer.encode = never
    r = httpx.post(f"{url}/s/b/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * (4 << 20)}]},
                   timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    assert "refused without tokenising" in r.json()["error"]["message"] and gw.end("b").calls == 0
