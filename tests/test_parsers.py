import json

from hypothesis import given, settings
from hypothesis import strategies as st

from sleuth.envs import DocReadEnv, JSONParser, TextParser, ToolCall

TOOLS = DocReadEnv(tasks=None).tools
J, T = JSONParser(), TextParser()


def calls(res):
    return [(c.name, c.arguments) for c in res.calls]


def test_hermes_blocks_with_and_without_closing_tag():
    assert calls(J.parse('x <tool_call>{"name": "read", "arguments": {"doc": 3}}</tool_call> y', TOOLS)) == [
        ("read", {"doc": 3})]
    assert calls(J.parse('<tool_call>\n{"name": "read", "arguments": {"doc": 3}}', TOOLS)) == [("read", {"doc": 3})]
    two = ('<tool_call>{"name":"read","arguments":{"doc":1}}</tool_call>'
           '<tool_call>{"name":"read","arguments":{"doc":2}}</tool_call>')
    assert len(J.parse(two, TOOLS).calls) == 2


def test_openai_style_json_calls():
    fn = {"type": "function", "function": {"name": "read", "arguments": json.dumps({"doc": 5})}}
    assert calls(J.parse(json.dumps(fn), TOOLS)) == [("read", {"doc": 5})]
    assert calls(J.parse(json.dumps({"tool_calls": [fn]}), TOOLS)) == [("read", {"doc": 5})]
    assert calls(J.parse('```json\n{"name": "answer", "arguments": {"text": "x"}}\n```', TOOLS)) == [
        ("answer", {"text": "x"})]


def test_json_errors_say_what_is_wrong():
    assert "not valid JSON" in J.parse("<tool_call>{name: read}</tool_call>", TOOLS).error
    assert '"name"' in J.parse('<tool_call>{"arguments": {}}</tool_call>', TOOLS).error
    assert "arguments of 'read' are not valid JSON" in J.parse('{"name": "read", "arguments": "{oops"}', TOOLS).error
    assert "must be a JSON object" in J.parse('<tool_call>[1, 2]</tool_call>', TOOLS).error
    assert "no tool call found" in J.parse("I think the answer is Paris", TOOLS).error


def test_text_commands():
    assert calls(T.parse("read 3", TOOLS)) == [("read", {"doc": "3"})]
    assert calls(T.parse("Answer: Denise Levertov", TOOLS)) == [("answer", {"text": "Denise Levertov"})]
    assert calls(T.parse("The answer is: \nEglon, Canaan.", TOOLS)) == [("answer", {"text": "Eglon, Canaan."})]
    assert calls(T.parse("The answer to this question is: 6", TOOLS)) == [("answer", {"text": "6"})]
    assert calls(T.parse('answer "yes"', TOOLS)) == [("answer", {"text": "yes"})]
    assert calls(T.parse('read {"doc": 2}', TOOLS)) == [("read", {"doc": 2})]
    # a filler word ("is", "was") only as a whole word: these titles start with its letters
    assert calls(T.parse("read Ishtup-Ishar", TOOLS)) == [("read", {"doc": "Ishtup-Ishar"})]
    assert calls(T.parse("answer: Wasilla", TOOLS)) == [("answer", {"text": "Wasilla"})]
    assert calls(T.parse("answer Isaac Newton", TOOLS)) == [("answer", {"text": "Isaac Newton"})]
    assert "no command found" in T.parse("Hello there", TOOLS).error
    assert "no command found" in T.parse("read", TOOLS).error  # a bare tool name without its argument


def test_render_parses_back():
    for parser in (J, T):
        for call in (ToolCall("read", {"doc": 7}), ToolCall("answer", {"text": "New York City"})):
            parsed = parser.parse(parser.render(call), TOOLS).calls[0]
            assert (parsed.name == call.name
                    and str(parsed.arguments[next(iter(call.arguments))]) == str(next(iter(call.arguments.values()))))


@settings(max_examples=400, deadline=None)
@given(st.text())
def test_parsers_never_raise_on_arbitrary_text(s):
    for parser in (J, T):
        res = parser.parse(s, TOOLS)
        assert res.calls or res.error


json_like = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                         lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                         max_leaves=10)


@settings(max_examples=300, deadline=None)
@given(json_like)
def test_parsers_never_raise_on_arbitrary_json(obj):
    blob = json.dumps(obj)
    for text in (blob, f"<tool_call>{blob}</tool_call>", f"answer {blob}", f"read {blob}"):
        for parser in (J, T):
            parser.parse(text, TOOLS)
