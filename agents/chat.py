"""Chat rendering with token-in/token-out: the prompt is the model's own chat template; after each
action the loop appends only the ids of what came next (the end of the assistant turn, the tool
messages, the next generation prompt). The policy's ids are never re-tokenised.

The one documented difference from re-rendering the whole conversation with the template: the
template closes every assistant turn with its terminator (ChatML: `<|im_end|>\\n`); a trajectory's
final action ends at the end-of-turn token the policy sampled (or is cut off at max_tokens), so the
trailing part of the terminator after it is absent from the trajectory."""

from __future__ import annotations

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
        eos = tokenizer.eos_token_id
        self.stop_ids: set[int] = {eos} if isinstance(eos, int) else set(eos or [])

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        return self.encode(self.render(messages, add_generation_prompt=True))

    def observation_ids(self, new_messages: list[dict[str, Any]], action_ids: list[int]) -> list[int]:
        """Ids to append after `action_ids` so the sequence continues exactly as the template renders
        `new_messages` (e.g. tool results) followed by the next assistant generation prompt."""
        full = self.render(_BASE + list(new_messages), add_generation_prompt=True)
        if not full.startswith(self._base_text):
            raise ValueError("this chat template re-renders earlier turns when messages are added; "
                             "token-in/token-out needs a prefix-stable template")
        delta = full[len(self._base_text):]
        closing = self.terminator
        if action_ids and action_ids[-1] in self.stop_ids:
            stop_text = self.tokenizer.decode([action_ids[-1]])
            if closing.startswith(stop_text):
                closing = closing[len(stop_text):]
        return self.encode(closing + delta)
