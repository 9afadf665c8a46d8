"""What the judge is shown and how its reply is read. Pointwise: one response, one score. Group: the members of
a group in one prompt (numbered in the order shown), one score each. A reply with no usable score is `Junk`: the
call is tried again and, if every try fails, the episode is failed as an infrastructure failure, never scored."""

from __future__ import annotations

import re
from dataclasses import dataclass

from sleuth.core.errors import BadInput
from sleuth.verifiers.judge.config import JudgeConfig

SCORE_PATTERNS = {
    "pointwise": r"(?i)score\s*[:=]?\s*(\d+(?:\.\d+)?)",
    "group": r"(?i)response\s*#?\s*(\d+)\s*[:\-]?\s*score\s*[:=]?\s*(\d+(?:\.\d+)?)",
}

POINTWISE = """Grade the response by this rubric: {rubric}

Question: {question}
{reference_line}Response:
<<<
{response}
>>>

Give your reasons in one or two sentences, then end with a line exactly like "SCORE: N",
N a number from 0 to {scale}."""

POINTWISE_LABELS = """Judge the response by this rubric: {rubric}

Question: {question}
{reference_line}Response:
<<<
{response}
>>>

Does the response meet the rubric? Answer with one word: {label_words}."""

GROUP = """Grade each of the {count} responses below by this rubric: {rubric}
Compare them with each other: a better response gets a higher score.

Question: {question}
{reference_line}{members}

Give your reasons in a few sentences, then end with one line per response exactly like "RESPONSE i SCORE: N",
N a number from 0 to {scale}."""


class Junk(BadInput):
    """A reply the judge's settings cannot read a score from."""


@dataclass(frozen=True)
class Shown:
    """One task as the judge sees it."""

    question: str
    reference: str | None


def cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n…[{len(text) - limit} more characters cut]"


def _reference_line(cfg: JudgeConfig, shown: Shown) -> str:
    return f"Reference answer: {shown.reference}\n" if cfg.reference and shown.reference else ""


def pointwise_messages(cfg: JudgeConfig, shown: Shown, response: str) -> list[dict[str, str]]:
    template = cfg.prompt or (POINTWISE_LABELS if cfg.labels else POINTWISE)
    text = template.format(rubric=cfg.rubric, question=shown.question, scale=_num(cfg.scale),
                           reference=shown.reference or "", reference_line=_reference_line(cfg, shown),
                           response=cut(response, cfg.max_chars), label_words=" or ".join(cfg.labels or {}))
    return [{"role": "system", "content": cfg.system}, {"role": "user", "content": text}]


def group_messages(cfg: JudgeConfig, shown: Shown, responses: list[str]) -> list[dict[str, str]]:
    members = "\n".join(f"Response {i + 1}:\n<<<\n{cut(r, cfg.max_chars)}\n>>>" for i, r in enumerate(responses))
    text = (cfg.prompt or GROUP).format(rubric=cfg.rubric, question=shown.question, scale=_num(cfg.scale),
                                        reference=shown.reference or "", reference_line=_reference_line(cfg, shown),
                                        members=members, count=len(responses), response="", label_words="")
    return [{"role": "system", "content": cfg.system}, {"role": "user", "content": text}]


def _num(x: float) -> str:
    return f"{x:g}"


def _in_range(cfg: JudgeConfig, value: str, reply: str) -> float:
    score = float(value)
    if not 0 <= score <= cfg.scale:
        raise Junk(f"score {value} is outside 0..{_num(cfg.scale)} in the judge's reply {reply[-200:]!r}")
    return score / cfg.scale


def read_pointwise(cfg: JudgeConfig, reply: str) -> float:
    """The last score in the reply, in [0, 1]; with `labels`, the score of the first label word in it."""
    if cfg.labels:
        words = "|".join(re.escape(w) for w in sorted(cfg.labels, key=len, reverse=True))
        first = re.search(rf"(?i)\b({words})\b", reply)
        if first is None:
            raise Junk(f"none of {', '.join(cfg.labels)} in the judge's reply {reply[-200:]!r}")
        return float(next(v for k, v in cfg.labels.items() if k.lower() == first.group(1).lower()))
    found = re.findall(cfg.score_pattern or SCORE_PATTERNS["pointwise"], reply)
    if not found:
        raise Junk(f"no score in the judge's reply {reply[-200:]!r}")
    return _in_range(cfg, found[-1], reply)


def read_group(cfg: JudgeConfig, reply: str, count: int) -> list[float]:
    """One score per member, in the order shown, in [0, 1]; a member scored twice keeps its last score."""
    scores: dict[int, float] = {}
    for number, value in re.findall(cfg.score_pattern or SCORE_PATTERNS["group"], reply):
        if 1 <= int(number) <= count:
            scores[int(number) - 1] = _in_range(cfg, value, reply)
    missing = [i + 1 for i in range(count) if i not in scores]
    if missing:
        raise Junk(f"no score for response(s) {missing} in the judge's reply {reply[-200:]!r}")
    return [scores[i] for i in range(count)]


def ranks(scores: list[float]) -> list[float]:
    """Each member's rank, 1 for the best; tied members share the mean of the ranks they span."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    out = [0.0] * len(scores)
    at = 0
    while at < len(order):
        end = at
        while end + 1 < len(order) and scores[order[end + 1]] == scores[order[at]]:
            end += 1
        for k in range(at, end + 1):
            out[order[k]] = (at + end) / 2 + 1
        at = end + 1
    return out


def rank_rewards(scores: list[float]) -> list[float]:
    """Ranks spaced evenly in [0, 1]: the best member 1, the worst 0, ties the mean of their places
    (`(G - rank) / (G - 1)`); a group of one gets 0.5."""
    g = len(scores)
    if g == 1:
        return [0.5]
    return [(g - r) / (g - 1) for r in ranks(scores)]
