"""Chat rendering with token-in/token-out: the prompt is the model's own chat template; after each
action the loop appends only the ids of what came next (the end of the assistant turn, the tool
messages, the next generation prompt). The policy's ids are never re-tokenised.

The one documented difference from re-rendering the whole conversation with the template: the
template closes every assistant turn with its terminator (ChatML: `<|im_end|>\\n`); a trajectory's
final action ends at the end-of-turn token the policy sampled (or is cut off at max_tokens), so the
trailing part of the terminator after it is absent from the trajectory."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

_PROBE = "\u2063PROBE\u2063"  # an assistant content that no template alters
_BASE = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]


class ChatRenderer:
    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat template; pass a chat model or set tokenizer.chat_template")
        convo = self.render([{"role": "user", "content": "u"}, {"role": "assistant", "content": _PROBE}])
        # What the template writes after an assistant message's content: the turn terminator.
        self.terminator = convo[convo.index(_PROBE) + len(_PROBE):]
        self._base_text = self.render(_BASE)
        self._generation_prompt = self.render(_BASE, add_generation_prompt=True)[len(self._base_text):]
        self._wrappers: dict[str, tuple[str, str] | None] = {}
        self._stop_text: dict[int, str] = {}
        self.encode = _segment_encoder(tokenizer, [self.render(_BASE, True), self._generation_prompt + " x\n"])
        eos = tokenizer.eos_token_id
        self.stop_ids: set[int] = {eos} if isinstance(eos, int) else set(eos or [])

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False,
               tools: list[dict[str, Any]] | None = None) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                                  tools=tools)

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The first prompt; `tools` (OpenAI tool schemas) go to the template, for an env in the `template` harness:
        refused where the template does not render them (the model would never see its tools)."""
        if tools and not self.renders_tools:
            raise ValueError("this model's chat template does not render tools, so the `template` harness would "
                             "hide them from it: use the json harness (tools in the system message)")
        return self.encode(self.render(messages, add_generation_prompt=True, tools=tools or None))

    @functools.cached_property
    def renders_tools(self) -> bool:
        return template_renders_tools(self.tokenizer)

    def observation_ids(self, new_messages: list[dict[str, Any]], action_ids: list[int]) -> list[int]:
        """Ids to append after `action_ids` so the sequence continues exactly as the template renders
        `new_messages` (e.g. tool results) followed by the next assistant generation prompt."""
        return self.encode(self.observation_text(new_messages, action_ids))

    def observation_text(self, new_messages: list[dict[str, Any]], action_ids: list[int]) -> str:
        closing = self.terminator
        if action_ids and action_ids[-1] in self.stop_ids:
            stop_text = self._stop_text.get(action_ids[-1])
            if stop_text is None:
                stop_text = self._stop_text[action_ids[-1]] = self.tokenizer.decode([action_ids[-1]])
            if closing.startswith(stop_text):
                closing = closing[len(stop_text):]
        pieces = [closing]
        for m in new_messages:
            wrap = self._wrapper(m) if m.keys() == {"role", "content"} else None
            if wrap is None:  # a template that transforms content or renders other keys: render it for real
                return closing + self._delta(new_messages)
            pieces += [wrap[0], m["content"], wrap[1]]
        pieces.append(self._generation_prompt)
        return "".join(pieces)

    def _delta(self, new_messages: list[dict[str, Any]]) -> str:
        full = self.render(_BASE + list(new_messages), add_generation_prompt=True)
        if not full.startswith(self._base_text):
            raise ValueError("this chat template re-renders earlier turns when messages are added; "
                             "token-in/token-out needs a prefix-stable template")
        return full[len(self._base_text):]

    def _wrapper(self, message: dict[str, Any]) -> tuple[str, str] | None:
        """(text before, text after) the content of a message of this role, cached per role: a jinja render
        per observation costs more than the rest of a loop turn. Only used when the template provably
        copies content verbatim (checked once per role with a whitespace- and markup-laden probe)."""
        role = message["role"]
        if role not in self._wrappers:
            text = self._delta([{"role": role, "content": _PROBE}])
            pre, _, post = text.partition(_PROBE)
            post = post[: len(post) - len(self._generation_prompt)] if post.endswith(self._generation_prompt) else None
            probe = " \n<x> {{ y }} \n"
            ok = (post is not None
                  and self._delta([{"role": role, "content": probe}]) == pre + probe + post + self._generation_prompt)
            self._wrappers[role] = (pre, post) if ok else None
        return self._wrappers[role]


_PROBE_TOOL = {"type": "function", "function": {"name": "probe_tool_name", "description": "probe",
                                                "parameters": {"type": "object", "properties": {}}}}


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template shows the `tools` it is given (Qwen's, Llama 3.1's do; SmolLM2's
    renders only role and content)."""
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "u"}], tools=[_PROBE_TOOL], tokenize=False)
    except Exception:  # a template that refuses tools renders none
        return False
    return "probe_tool_name" in text


def _segment_encoder(tokenizer: Any, probes: list[str]) -> Callable[[str], list[int]]:
    """`encode(text)` that splits at the tokenizer's added tokens itself and memoises the text between
    them. Tokenizers split at added tokens before anything else, so this is exact; it is checked on
    probes and the plain encoder is used if not. Why: the system prompt and tool schemas repeat in every
    episode and the same documents recur across a GRPO group, and tokenising dominated a loop turn
    (bench/env_step.py)."""

    def plain(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    added = {t.content: i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    if not added:
        return plain
    split = re.compile("(" + "|".join(re.escape(t) for t in sorted(added, key=len, reverse=True)) + ")").split
    cached = functools.lru_cache(maxsize=16384)(lambda s: tuple(plain(s)))

    def segmented(text: str) -> list[int]:
        out: list[int] = []
        for i, part in enumerate(split(text)):
            if i % 2:
                out.append(added[part])
            elif part:
                out.extend(cached(part))
        return out

    specials = "".join(added)
    probes = [*probes, f" a{specials} b \n{specials}\n\n c  ", f"{specials}x{specials}"]
    return segmented if all(segmented(p) == plain(p) for p in probes) else plain
