"""OpenAI chat messages as the model's chat template sees them, and the model's tool-call text as OpenAI
`tool_calls`.

A template that renders `tools` and assistant `tool_calls` itself (Qwen, Llama 3.1, ...) gets them as they
are. One that ignores them (SmolLM2's renders only role and content) would show the model neither the tools
nor its own earlier calls, so the tools go into the system message with sleuth's JSON harness instructions
(Hermes `<tool_call>{...}</tool_call>`), and an assistant message's calls are written back into its content
in that format. Either way the model's reply is parsed with the JSON harness's parser."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from sleuth.agents.chat import template_renders_tools
from sleuth.core.errors import BadInput
from sleuth.envs.parsers import NO_CALL, JSONParser, ParseResult, ToolCall
from sleuth.envs.tools import Tool

_PROBE_CALL = {"id": "c0", "type": "function", "function": {"name": "probe_call_name", "arguments": "{}"}}


class MessageError(BadInput):
    """A request's messages or tools cannot be read (the server answers 400)."""


def content_text(content: Any) -> str:
    """A message's content as text: a string, None, or a list of parts of which the text parts count."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(parts) != len(content):
            raise MessageError("only text content parts are supported")
        return "".join(parts)
    raise MessageError(f"a message's content must be a string or a list of parts, got {type(content).__name__}")


def _arguments(raw: Any) -> Any:
    """Tool-call arguments as a value: agents send them back as the JSON string they got (or re-serialised)."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def normalise(message: Any) -> dict[str, Any]:
    """What identifies a message when deciding whether a call extends the previous one: role, content text,
    tool calls (id, name, arguments as values) and tool-call id; SDK extras (refusal, audio, annotations)
    and serialisation details (key order, `null` vs missing, argument spacing) do not count."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise MessageError("every message must be an object with a string 'role'")
    out: dict[str, Any] = {"role": message["role"], "content": content_text(message.get("content"))}
    calls = message.get("tool_calls") or []
    if calls:
        try:
            out["tool_calls"] = [(c.get("id"), c["function"]["name"], _arguments(c["function"].get("arguments")))
                                 for c in calls]
        except (KeyError, TypeError, AttributeError):
            raise MessageError("a tool call needs {'id', 'function': {'name', 'arguments'}}") from None
    if message.get("tool_call_id") is not None:
        out["tool_call_id"] = message["tool_call_id"]
    return out


@dataclass
class Reply:
    """The model's text as an OpenAI assistant message."""

    message: dict[str, Any]
    tool_call: dict[str, Any] | None  # the first call, as a trajectory's turn records it
    # the text tries to call a tool and fails (bad JSON, a tool not offered), or calls one with arguments its
    # schema does not take (such calls still reach the agent: it runs its own tools)
    error: str | None = None


class ChatFormat:
    """How this tokenizer's template sees OpenAI messages, and how replies become OpenAI messages."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.parser = JSONParser()
        user = [{"role": "user", "content": "u"}]
        self.renders_tools = template_renders_tools(tokenizer)
        called = [*user, {"role": "assistant", "content": "", "tool_calls": [_PROBE_CALL]}]
        self.renders_tool_calls = "probe_call_name" in self._render(called, None)
        probe = self._render([*user, {"role": "assistant", "content": "probe_reply"}], None)
        self._terminator = probe.partition("probe_reply")[2]  # what the template writes after a reply

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
        except Exception:  # a template that refuses the probe renders nothing of it
            return ""

    def template_messages(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
                          ) -> list[dict[str, Any]]:
        """`messages` (normalised) for `apply_chat_template` (with `template_tools(tools)`)."""
        out = []
        for m in messages:
            if m["role"] == "assistant" and m.get("tool_calls"):
                if self.renders_tool_calls:
                    calls = [{"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                             for i, n, a in m["tool_calls"]]
                    out.append({"role": "assistant", "content": m["content"], "tool_calls": calls})
                else:
                    out.append({"role": "assistant", "content": self.assistant_text(m)})
            elif m["role"] == "tool" and self.renders_tool_calls:
                out.append({"role": "tool", "content": m["content"], "tool_call_id": m.get("tool_call_id")})
            else:
                out.append({"role": m["role"], "content": m["content"]})
        if tools and not self.renders_tools:
            instructions = self.parser.instructions(_tools(tools))
            if out and out[0]["role"] == "system":
                out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{instructions}"}
            else:
                out.insert(0, {"role": "system", "content": instructions})
        return out

    def assistant_text(self, message: dict[str, Any]) -> str:
        """What the model writes for an assistant message (normalised): its content, then each tool call as
        the template renders calls or, where it does not, in the JSON harness format. Demonstrations replayed
        through the gateway (`replay_chat`) are these texts."""
        if not message.get("tool_calls"):
            return message["content"]
        if not self.renders_tool_calls:
            return "\n".join([message["content"]] * bool(message["content"]) +
                             [self.parser.render(ToolCall(n, a if isinstance(a, dict) else {}))
                              for _, n, a in message["tool_calls"]])
        user = [{"role": "user", "content": "u"}]
        before = self.tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
        after = self.tokenizer.apply_chat_template([*user, *self.template_messages([message], None)], tokenize=False)
        if not after.startswith(before):
            raise MessageError("this chat template re-renders the conversation when an assistant message is added")
        return after[len(before):].removesuffix(self._terminator)

    def template_tools(self, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        return tools if tools and self.renders_tools else None

    def reply(self, text: str, tools: list[dict[str, Any]] | None) -> Reply:
        """The assistant message for `text`: with `tool_calls` when tools were offered and the text calls
        one (the text before the call is its content), else the text as content."""
        offered = _tools(tools)
        parsed = self.parser.parse(text, offered) if offered else None
        calls = [c for c in parsed.calls if c.name in offered] if parsed else []
        if not calls:
            return Reply({"role": "assistant", "content": text}, None, _call_error(parsed, offered))
        before = text.split("<tool_call>", 1)[0].strip() if "<tool_call>" in text else ""
        message = {"role": "assistant", "content": before or None, "tool_calls": [
            {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}} for c in calls]}
        wrong = next((err for c in calls if (err := offered[c.name].check_arguments(c.arguments)[1])), None)
        return Reply(message, calls[0].to_dict(), wrong)  # the agent gets its calls as written, whatever they are


def _call_error(parsed: ParseResult | None, offered: dict[str, Tool]) -> str | None:
    """Why a reply that tries to call a tool calls none; None for plain text (an answer) or no tools offered."""
    if parsed is None or parsed.error == NO_CALL:
        return None
    if parsed.error:
        return parsed.error
    unknown = sorted({c.name for c in parsed.calls} - set(offered))
    return f"no tool is named {', '.join(unknown)}; the tools are {', '.join(offered)}"


def _tools(tools: list[dict[str, Any]] | None) -> dict[str, Tool]:
    """OpenAI tool definitions as sleuth `Tool`s (for the harness's instructions and parser)."""
    out = {}
    for t in tools or []:
        try:
            tool = Tool.run_elsewhere(t)
        except (KeyError, TypeError):
            raise MessageError("a tool must be {'type': 'function', 'function': {'name', ...}}") from None
        out[tool.name] = tool
    return out
