"""A chat tokenizer with no model behind it: the core install (`pip install sleuth`, no transformers)
evaluates scripted policies with it. A scripted policy writes text, never samples ids, and its episodes are
scored on that text, so any exact, reversible tokenisation gives the same scores; this one is UTF-8 bytes
(ids 0–255) and two ChatML markers. Trajectories that a model trains on (SFT demonstrations, RL) use the
model's own tokenizer instead."""

from __future__ import annotations

import re
from typing import Any

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIAL = {IM_START: 256, IM_END: 257}
_SPLIT = re.compile(f"({re.escape(IM_START)}|{re.escape(IM_END)})").split


class ByteChatTokenizer:
    """The slice of a Hugging Face tokenizer that `agents.chat.ChatRenderer` and the scripted policies use:
    ChatML rendering (`apply_chat_template`), `encode`, `decode`, `eos_token_id`."""

    name_or_path = "bytes"
    chat_template = "chatml"  # rendered by `apply_chat_template` below, not by jinja
    eos_token_id = SPECIAL[IM_END]
    pad_token_id = SPECIAL[IM_END]

    def apply_chat_template(self, messages: list[dict[str, Any]], tokenize: bool = False,
                            add_generation_prompt: bool = False, **_: Any) -> str | list[int]:
        text = "".join(f"{IM_START}{m['role']}\n{m.get('content') or ''}{IM_END}\n" for m in messages)
        if add_generation_prompt:
            text += f"{IM_START}assistant\n"
        return self.encode(text) if tokenize else text

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids: list[int] = []
        for i, part in enumerate(_SPLIT(text)):
            ids.extend([SPECIAL[part]] if i % 2 else part.encode("utf-8"))
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        names = {v: k for k, v in SPECIAL.items()}
        out, run = [], bytearray()
        for i in ids:
            if i < 256:
                run.append(i)
                continue
            out.append(run.decode("utf-8", errors="replace"))
            run = bytearray()
            if not skip_special_tokens:
                out.append(names[i])
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)
