"""An agent's tool use through the gateway: demonstrations with OpenAI tools replayed exactly as the gateway
renders an agent's calls, the reads recognised in an unchanged agent's tool results (support recall, info-gain
step rewards), and invalid tool calls counted."""

import json
from pathlib import Path

import numpy as np
import pytest

from sleuth import rewards
from sleuth.agents.eval.episodes import summarise
from sleuth.agents.gateway import Gateway, create_app
from sleuth.agents.gateway.agent_runner import load_agent, run_agent_episodes
from sleuth.agents.gateway.reads import recognise_reads
from sleuth.agents.gateway.render import ChatFormat, normalise
from sleuth.agents.policies.base import Generation, SamplingParams
from sleuth.agents.trajectory import Trajectory, Turn
from sleuth.core.net import in_thread
from sleuth.rewards.episodes import per_episode
from sleuth.tasks.qa import qa_docs
from sleuth.training.sft.data import replay_chats
from sleuth.training.sft.tool_demos import tool_demo

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "openai_agent"
READ = {"type": "function", "function": {"name": "read", "description": "Read a document.", "parameters": {
    "type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}}}


def _call(name, **args):
    return {"id": f"rec_{name}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def test_a_tool_record_replays_as_the_template_of_the_whole_conversation_with_only_the_calls_trained(tokenizer):
    messages = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "Capital of France?"},
                {"role": "assistant", "content": None, "tool_calls": [_call("read", title="Paris")]},
                {"role": "tool", "tool_call_id": "rec_read", "content": "Paris is the capital of France."},
                {"role": "assistant", "content": "Answer: Paris"}]
    [traj] = replay_chats([{"id": "r0", "messages": messages, "tools": [READ]}], tokenizer)
    fmt = ChatFormat(tokenizer)
    full = tokenizer.apply_chat_template(fmt.template_messages([normalise(m) for m in messages], [READ]),
                                         tokenize=False)
    assert tokenizer.decode(traj.token_ids()) == full.rstrip("\n")  # the tools in the system message, as served
    trained = tokenizer.decode([i for i, m in zip(traj.token_ids(), traj.loss_mask(), strict=True) if m])
    assert trained == ('<tool_call>\n{"name": "read", "arguments": {"title": "Paris"}}\n</tool_call><|im_end|>'
                       "Answer: Paris<|im_end|>")
    assert traj.turns[0].tool_call == {"name": "read", "arguments": {"title": "Paris"}} and traj.segments == 1
    with pytest.raises(ValueError, match="r1: message 2's tool calls read back as"):  # a tool the record lacks
        replay_chats([{"id": "r1", "messages": messages, "tools": None}], tokenizer)


def test_tool_demos_vary_what_an_agent_author_chooses_and_read_what_the_search_showed(hotpot_tasks, tokenizer):
    train = hotpot_tasks[:40]
    records = [tool_demo(t) for t in train]
    assert records == [tool_demo(t) for t in train]  # drawn from the task's own seed
    names = {t["function"]["name"] for r in records for t in r["tools"]}
    assert len(names) >= 10 and {"search", "read"} <= names
    assert sum(r["messages"][0]["role"] != "system" for r in records) >= 1
    for task, r in zip(train, records, strict=True):
        last = r["messages"][-1]
        said = last["content"] or json.loads(last["tool_calls"][0]["function"]["arguments"]).popitem()[1]
        assert said in (task.answer, f"Answer: {task.answer}")
        reads = [m for m in r["messages"] if m["role"] == "tool" and any(
            m["content"].endswith(d.text) for d in qa_docs(task).docs)]
        assert 1 <= len(reads) <= 2
    trajs = replay_chats(records, tokenizer)
    assert len(trajs) == len(records) and all(t.segments == 1 for t in trajs)


class ScriptedEngine:
    """Test double for the engine: writes `text(request)` for each call, as canonical ids + end of turn."""

    name, version, parallel_calls, max_context = "scripted", 1, 1, None

    def __init__(self, tokenizer, text):
        self.tokenizer, self._text = tokenizer, text

    def generate(self, requests, sampling):
        out = []
        for r in requests:
            text = self._text(r)
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            out.append(Generation(ids, [-0.5] * len(ids), text))
        return out


class OracleEngine(ScriptedEngine):
    """Searches with the question, reads the task's first supporting title, then answers (or, for one task,
    writes a broken call first)."""

    def __init__(self, tokenizer, broken_task=None):
        super().__init__(tokenizer, self._script)
        self.broken_task = broken_task

    def _script(self, request):
        task, turn = request.task, request.turn
        if task.id == self.broken_task and turn == 0:
            return '<tool_call>\n{"name": "read", "arguments": {"title": </tool_call>'
        turn -= task.id == self.broken_task
        script = [json.dumps({"name": "search", "arguments": {"query": task.question}}),
                  json.dumps({"name": "read", "arguments": {"title": task.payload["supporting"][0]}})]
        return f"<tool_call>\n{script[turn]}\n</tool_call>" if turn < 2 else f"Answer: {task.answer}"


def test_an_unchanged_agents_reads_are_recognised_and_priced(hotpot_tasks, tokenizer):
    tasks = hotpot_tasks[:3]
    gateway = Gateway(OracleEngine(tokenizer, broken_task=tasks[2].id), SamplingParams(max_tokens=64))
    with in_thread(create_app(gateway)) as url:
        trajs = list(run_agent_episodes(load_agent("append_agent:run", str(EXAMPLES)), tasks, gateway, url, "qa",
                                        concurrency=3))
    by_task = {t.task_id: t for t in trajs}
    for task in tasks:
        t = by_task[task.id]
        reads = [turn.read for turn in t.turns if turn.read]
        assert [(r.title, r.gold, r.reread) for r in reads] == [(task.payload["supporting"][0], True, False)]
        assert t.verdict.details["support_recall"] == 1 / len(task.payload["supporting"]) and t.verdict.score == 1.0
    broken = by_task[tasks[2].id].turns[0]
    assert broken.tool_call is None and "not valid JSON" in broken.error
    s = summarise(trajs, 1.0, {})
    assert s["mean_reads"] == s["mean_gold_reads"] == 1.0 and s["tool_calls"] == 2.0
    assert s["valid_call_share"] == pytest.approx((1 + 1 + 2 / 3) / 3, abs=1e-4)
    # information gain priced by the labels: 1 / |gold| on the turn that read a gold document, nothing elsewhere
    support = rewards.make("info_gain", variant="support")
    steps = support.step_rewards(trajs, {t.id: t for t in tasks})
    for t, r in zip(trajs, steps, strict=True):
        read_turn = next(i for i, turn in enumerate(t.turns) if turn.read)
        assert r[read_turn] == 0.5 and sum(r) == 0.5


def test_the_numbered_agent_lists_opens_by_integer_and_its_reads_count(hotpot_tasks, tokenizer):
    def script(request):
        task = request.task
        gold = next(i for i, d in enumerate(qa_docs(task).docs) if d.title == task.payload["supporting"][0])
        calls = ['{"name": "list_paragraphs", "arguments": {}}',
                 json.dumps({"name": "open_paragraph", "arguments": {"number": gold}})]
        return f"<tool_call>\n{calls[request.turn]}\n</tool_call>" if request.turn < 2 else task.answer

    gateway = Gateway(ScriptedEngine(tokenizer, script), SamplingParams(max_tokens=64))
    with in_thread(create_app(gateway)) as url:
        trajs = list(run_agent_episodes(load_agent("numbered_agent:run", str(EXAMPLES)), hotpot_tasks[:2], gateway,
                                        url, "qa", concurrency=2))
    s = summarise(trajs, 1.0, {})
    assert s["n"] == 2 and s["score"] == 1.0 and s["tool_calls"] == 2.0 and s["valid_call_share"] == 1.0
    assert s["mean_gold_reads"] == 1.0 and s["support_recall"] == 0.5


def test_reads_are_documents_shown_in_full_not_titles_and_a_second_showing_is_a_reread(hotpot_tasks):
    task = hotpot_tasks[0]
    docs = qa_docs(task).docs
    gold = task.payload["supporting"][0]
    text = {d.title: d.text for d in docs}
    other = next(d for d in docs if d.title not in task.payload["supporting"])
    obs = ["\n".join(d.title for d in docs), f"# {gold}\n{text[gold]}", other.text[:100], f"{gold}: {text[gold]}"]
    traj = Trajectory(task.id, "gateway", [0], turns=[Turn([1], [0.0], "x", observation=o) for o in obs])
    reads = recognise_reads([traj], task)
    assert [(r.title, r.gold, r.reread, r.turn) for r in reads] == [(gold, True, False, 1), (gold, True, True, 3)]
    assert traj.turns[0].read is None and traj.turns[2].read is None  # titles only; a cut document
    assert recognise_reads([traj], task.__class__(id="q", question="?")) is None  # a task without documents


def test_an_estimator_without_supports_segments_refuses_an_agent_episode_that_split_and_trains_one_that_did_not():
    def seg(episode, i, n, reward):
        read_turn = Turn([1, 1], [0.0, 0.0], "x")
        return Trajectory("t", "gateway", [0], turns=[Turn([1], [0.0], "y"), read_turn], reward=reward, group="g",
                          episode=episode, segment=i, segments=n)

    class Stepwise(rewards.Estimator):  # a second turn worth +1 on top of each episode's reward
        def __call__(self, trajs, tasks):
            return rewards.Advantages([np.array([t.reward, t.reward + 1.0, t.reward + 1.0]) for t in trajs], {})

    whole = [seg("a", 0, 1, 1.0), seg("b", 0, 1, 0.0)]
    assert [v.tolist() for v in per_episode(Stepwise(), whole, {}).values] == [[1, 2, 2], [0, 1, 1]]
    with pytest.raises(ValueError, match=r"episode a is 2 segments.*supports_segments \(dr_grpo, grpo, none, rloo\)"):
        per_episode(Stepwise(), [seg("a", 0, 2, 1.0), seg("a", 1, 2, 1.0), seg("b", 0, 1, 0.0)], {})


def test_a_reply_that_tries_a_call_and_fails_is_recorded_as_invalid_and_plain_text_is_not(tokenizer):
    fmt = ChatFormat(tokenizer)
    plain = fmt.reply("Answer: Paris", [READ])
    assert plain.error is None and plain.tool_call is None
    wrong_args = fmt.reply('<tool_call>\n{"name": "read", "arguments": {"doc": 3}}\n</tool_call>', [READ])
    assert wrong_args.message["tool_calls"] and "missing argument(s) ['title']" in wrong_args.error
    unknown = fmt.reply('<tool_call>\n{"name": "open", "arguments": {"title": "x"}}\n</tool_call>', [READ])
    assert unknown.message["content"] and unknown.error == "no tool is named open; the tools are read"
    assert "not valid JSON" in fmt.reply("<tool_call>\n{name: read}\n</tool_call>", [READ]).error
    assert fmt.reply("<tool_call>{}</tool_call>", None).error is None  # no tools offered: text is text


HERMES = """{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}
{% endif %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools><|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'system' and tools %}
{%- elif m.role == 'assistant' %}<|im_start|>assistant
{% if m.content %}{{ m.content }}{% endif %}{% for c in m.tool_calls or [] %}<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments }}}
</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def test_a_template_that_renders_tool_calls_trains_its_own_call_format():
    from sleuth.agents.policies.load import load_tokenizer

    tokenizer = load_tokenizer("smollm2")
    tokenizer.chat_template = HERMES  # a Qwen/Hermes-style template: tools and calls rendered by the template
    messages = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "Capital of France?"},
                {"role": "assistant", "content": None, "tool_calls": [_call("read", title="Paris")]},
                {"role": "tool", "tool_call_id": "rec_read", "content": "Paris is the capital of France."},
                {"role": "assistant", "content": "Answer: Paris"}]
    fmt = ChatFormat(tokenizer)
    assert fmt.renders_tools and fmt.renders_tool_calls
    [traj] = replay_chats([{"id": "h0", "messages": messages, "tools": [READ]}], tokenizer)
    full = tokenizer.apply_chat_template(fmt.template_messages([normalise(m) for m in messages], [READ]),
                                         tools=[READ], tokenize=False)
    assert tokenizer.decode(traj.token_ids()) == full.rstrip("\n")
    assert "You can call these tools" not in full  # the template's own tool block, not the JSON harness's
    trained = tokenizer.decode([i for i, m in zip(traj.token_ids(), traj.loss_mask(), strict=True) if m])
    assert trained == ('<tool_call>\n{"name": "read", "arguments": {"title": "Paris"}}\n</tool_call><|im_end|>'
                       "Answer: Paris<|im_end|>")
