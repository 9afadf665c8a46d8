"""Pulling the scorable part out of a model's free-form reply: the answer of a QA reply, the program of a
code reply, the patch of a SWE reply. Used by harnesses (inside envs) and by the trainer adapters (outside any
env) alike."""

from __future__ import annotations

import re

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.S)
_ANSWER_TAG = re.compile(r"<answer>(.*?)(?:</answer>|\Z)", re.S | re.I)
# "Answer: X", "Final answer: X", "The answer is: X", "The (final) answer is X" at the start of a line
_ANSWER_LINE = re.compile(r"^\W*(?:the\s+)?(?:final\s+)?answer(?:\s*[:：]|\s+is\s*[:：]?)\s*(.+)$", re.I | re.M)


def extract_code(text: str) -> str:
    """The program in a reply: the last fenced block that defines something (```python, ```py or a bare
    fence; an unclosed fence runs to the end), else the last fenced block, else the text itself."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
    code = [body for lang, body in blocks if lang in ("", "python", "py", "python3")]
    if not code:
        return text.strip("\n")
    defining = [b for b in code if re.search(r"^\s*(def|class|import|from)\s", b, re.M)]
    return (defining or code)[-1].strip("\n")


def extract_answer(text: str) -> str:
    """The answer in a reply: the last <answer>…</answer>, else the rest of the last line that starts with
    "Answer:", "Final answer:", "The answer is:" or "The answer is" (without a final full stop), else the
    whole text."""
    tags = _ANSWER_TAG.findall(text)
    if tags:
        return tags[-1].strip()
    lines = _ANSWER_LINE.findall(text)
    return lines[-1].strip().removesuffix(".").strip() if lines else text.strip()


def extract_diff(text: str) -> str:
    """The patch in a reply: the last ```diff / ```patch block, else the text from its first `diff --git`
    or `--- ` header on (so a reply of prose followed by a raw diff works), else the text itself."""
    blocks = [body for lang, body in _FENCE.findall(text) if lang.lower() in ("diff", "patch")]
    if blocks:
        return blocks[-1]
    m = re.search(r"^(diff --git |--- )", text, re.M)
    return text[m.start():] if m else text
