"""Tool-call parsers: turn the policy's action text into tool calls, and render calls back into text
(for prompts and scripted policies). A parser never raises on any input: what it cannot read comes
back as `ParseResult.error`, which the env shows to the model."""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sleuth.core.registry import Registry
from sleuth.envs.tools import Tool


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments}


@dataclass
class ParseResult:
    calls: list[ToolCall] = field(default_factory=list)
    error: str | None = None


class ToolCallParser(ABC):
    """A tool-call format: how calls are read out of the model's text, how one is written (scripted
    policies and SFT demonstrations), what the prompt says about it, and how a tool's result is wrapped."""

    name: str

    @abstractmethod
    def parse(self, text: str, tools: Mapping[str, Tool]) -> ParseResult: ...

    @abstractmethod
    def render(self, call: ToolCall) -> str: ...

    @abstractmethod
    def instructions(self, tools: Mapping[str, Tool]) -> str: ...

    def wrap(self, observation: str) -> str:
        """The tool result as the model sees it (unchanged unless the format has its own tags)."""
        return observation


_TAG = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S)
_FENCED_ARG = re.compile(r"\s*```[ \t]*[\w+-]*[ \t]*\n(.*?)(?:```|\Z)", re.S)


def _call_from_obj(obj: Any) -> tuple[ToolCall | None, str | None]:
    """Accept `{"name", "arguments"}` (Hermes / Qwen), `{"type": "function", "function": {...}}` (OpenAI),
    with `arguments` either an object or a JSON string."""
    if not isinstance(obj, dict):
        return None, f"a tool call must be a JSON object, got {type(obj).__name__}"
    if isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None, 'a tool call needs a "name" string'
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError) as e:
            msg = e.msg if isinstance(e, json.JSONDecodeError) else "too deep or a number too long to read"
            return None, f"the arguments of {name!r} are not valid JSON: {msg}"
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return None, f'"arguments" of {name!r} must be a JSON object'
    return ToolCall(name, args), None


def _calls_from_json(blob: str) -> ParseResult:
    try:
        obj = json.loads(blob)
    except (ValueError, RecursionError) as e:  # ValueError: bad JSON, or an integer of over 4300 digits
        msg = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deeply" if isinstance(e, RecursionError) \
            else "a number too long to read"
        return ParseResult(error=f"tool call is not valid JSON ({msg})")
    items = obj.get("tool_calls") if isinstance(obj, dict) and "tool_calls" in obj else obj
    items = items if isinstance(items, list) else [items]
    calls = []
    for item in items:
        call, err = _call_from_obj(item)
        if err:
            return ParseResult(error=err)
        calls.append(call)
    return ParseResult(calls=calls)


NO_CALL = 'no tool call found: reply with <tool_call>{"name": ..., "arguments": {...}}</tool_call>'


class JSONParser(ToolCallParser):
    """Hermes / Qwen `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks; failing those, an
    OpenAI-style JSON function call (bare, or in a ```json fence). A missing closing tag is tolerated
    because generation often stops at the end-of-turn token right after the JSON."""

    name = "json"

    def parse(self, text: str, tools: Mapping[str, Tool]) -> ParseResult:
        blocks = _TAG.findall(text)
        if blocks:
            calls: list[ToolCall] = []
            for block in blocks:
                res = _calls_from_json(block.strip())
                if res.error:
                    return res
                calls.extend(res.calls)
            return ParseResult(calls=calls)
        fenced = _FENCE.search(text)
        candidate = (fenced.group(1) if fenced else text).strip()
        if candidate.startswith(("{", "[")):
            return _calls_from_json(candidate)
        return ParseResult(error=NO_CALL)

    def render(self, call: ToolCall) -> str:
        return "<tool_call>\n" + json.dumps(call.to_dict(), ensure_ascii=False) + "\n</tool_call>"

    def instructions(self, tools: Mapping[str, Tool]) -> str:
        schemas = "\n".join(json.dumps(t.schema(), ensure_ascii=False) for t in tools.values())
        example = next(iter(tools.values()))
        args = {k: f"<{k}>" for k in example.parameters.get("properties", {})}
        return (
            "You can call these tools:\n<tools>\n" + schemas + "\n</tools>\n"
            "Call exactly one tool per reply, in this format:\n" + self.render(ToolCall(example.name, args))
        )


class TextParser(ToolCallParser):
    """Plain-text commands for small models that follow JSON poorly (SmolLM2-135M makes an invalid JSON tool
    call in most turns): `read 3`,
    `answer: Denise Levertov`. Deliberately lenient, because a 135M model rarely starts its reply with the
    command: the earliest mention of a tool name that carries an argument counts, with light filler
    allowed ("The answer is: X", "answer to the question is X"); an empty rest of line takes the next
    non-empty line, and a fenced block (```...```) right after the tool name is the argument, however many
    lines it spans. Tools with several arguments take a JSON object: `name {...}`."""

    name = "text"
    _FILLER = r"(?:\s+(?:is|was|would be|to [^:\n]{0,60}? is)\b)?"  # \b: `read Isaac Newton` keeps "Is"

    def parse(self, text: str, tools: Mapping[str, Tool]) -> ParseResult:
        names = "|".join(re.escape(n) for n in sorted(tools, key=len, reverse=True))
        pattern = re.compile(rf"\b({names})\b{self._FILLER}\s*[:=(]?[ \t]*(.*)", re.I)
        lowered = {n.lower(): n for n in tools}
        for m in pattern.finditer(text):
            tool = tools[lowered[m.group(1).lower()]]
            rest = m.group(2).strip()
            fenced = _FENCED_ARG.match(text, m.start(2))
            if fenced:  # a multi-line argument: the body of a fenced block
                rest = fenced.group(1).strip("\n")
            elif not rest:
                after = text[m.end():].strip()
                rest = after.splitlines()[0].strip() if after else ""
                if pattern.match(rest):  # "I will submit:" followed by the real command on the next line
                    continue
            if not fenced:
                if rest.endswith(")") and rest.count(")") > rest.count("("):  # read(3), not "Title (film)"
                    rest = rest[:-1]
                rest = rest.strip().strip("`").strip()
            required = tool.parameters.get("required", [])
            if rest.startswith("{"):
                return _calls_from_json(json.dumps({"name": tool.name, "arguments": rest}))
            if len(required) > 1:
                return ParseResult(error=f"{tool.name} takes several arguments: write {tool.name} {{JSON object}}")
            if not required:
                return ParseResult(calls=[ToolCall(tool.name, {})])
            if rest:
                return ParseResult(calls=[ToolCall(tool.name, {required[0]: _strip_quotes(rest)})])
        examples = "; ".join(self.render(ToolCall(t.name, {p: "..." for p in t.parameters.get("required", [])}))
                             for t in tools.values())
        return ParseResult(error=f"no command found: reply with one command, e.g. {examples}")

    def render(self, call: ToolCall) -> str:
        values = list(call.arguments.values())
        if len(values) == 1 and "\n" in str(values[0]):
            return f"{call.name}\n```\n{values[0]}\n```"
        if len(values) == 1:
            return f"{call.name} {values[0]}"
        return f"{call.name} {json.dumps(call.arguments, ensure_ascii=False)}" if values else call.name

    def instructions(self, tools: Mapping[str, Tool]) -> str:
        lines = []
        for t in tools.values():
            args = " ".join(f"<{p}>" for p in t.parameters.get("properties", {}))
            lines.append(f"{t.name} {args}".rstrip() + f"  ({t.description})")
        return "Reply with exactly one command:\n" + "\n".join(lines)


class TagParser(ToolCallParser):
    """Search-R1's tag protocol, for any env: `<search> query </search>`, `<answer> text </answer>`; in
    general `<tool> argument </tool>` for a tool with one required argument. Tool results come back inside
    `<information>...</information>`; `<think>` blocks are ignored."""

    name = "tags"

    def parse(self, text: str, tools: Mapping[str, Tool]) -> ParseResult:
        visible = re.sub(r"<think>.*?(?:</think>|$)", "", text, flags=re.S)
        names = "|".join(re.escape(n) for n in tools)
        m = re.search(rf"<({names})>(.*?)(?:</\1>|$)", visible, re.S) if names else None
        if m is None:
            tags = " or ".join(f"<{n}>...</{n}>" for n in tools)
            return ParseResult(error=f"no action found: write {tags}")
        tool = tools[m.group(1)]
        required = tool.parameters.get("required", [])
        arg = m.group(2).strip()
        if len(required) > 1:
            return _calls_from_json(json.dumps({"name": tool.name, "arguments": arg}))
        if not required:
            return ParseResult(calls=[ToolCall(tool.name, {})])
        return ParseResult(calls=[ToolCall(tool.name, {required[0]: arg})])

    def render(self, call: ToolCall) -> str:
        values = list(call.arguments.values())
        body = values[0] if len(values) == 1 else (json.dumps(call.arguments) if values else "")
        return f"<{call.name}> {body} </{call.name}>"

    def instructions(self, tools: Mapping[str, Tool]) -> str:
        lines = [f"<{t.name}> ... </{t.name}>: {t.description}" for t in tools.values()]
        return ("You may think inside <think> </think>. Then act with exactly one of:\n" + "\n".join(lines) +
                "\nResults come back between <information> and </information>.")

    def wrap(self, observation: str) -> str:
        return f"<information>{observation}</information>"


def _strip_quotes(s: str) -> str:
    return s[1:-1] if len(s) >= 2 and s[0] == s[-1] and s[0] in "\"'" else s


class TemplateParser(JSONParser):
    """The model's own chat-template tool format: the env's tools go to the chat template (`tools=`), which shows
    them in its own words, so the harness adds no instructions; the reply's calls are read as Hermes / OpenAI JSON
    calls, the format the templates that render tools ask for (Qwen, Hermes, Llama 3.1). Needs a template that
    renders `tools` (the agent loop refuses one that does not)."""

    name = "template"

    def instructions(self, tools: Mapping[str, Tool]) -> str:
        return ""


class FreeParser(ToolCallParser):
    """The harness of envs whose action is the whole reply (reasoning-gym, GEM, TextArena: `envs/families`): no
    tool calls to read; a scripted policy's call is written as its one argument's text."""

    name = "free"

    def parse(self, text: str, tools: Mapping[str, Tool]) -> ParseResult:
        return ParseResult(error="this harness has no tool calls: the reply itself is the action")

    def render(self, call: ToolCall) -> str:
        return "".join(str(v) for v in call.arguments.values())

    def instructions(self, tools: Mapping[str, Tool]) -> str:
        return ""


# Tool-call formats by name (plugins: entry-point group `sleuth.parsers`, name → a ToolCallParser class).
PARSERS: Registry[Callable[[], ToolCallParser]] = Registry("tool-call format", group="sleuth.parsers")
for _name, _cls in {"json": JSONParser, "text": TextParser, "tags": TagParser, "searchr1": TagParser,
                    "free": FreeParser, "template": TemplateParser}.items():
    PARSERS.register(_name, _cls, "sleuth")


def get_parser(name: str | ToolCallParser) -> ToolCallParser:
    if not isinstance(name, str):
        return name
    return PARSERS.get(name)()
