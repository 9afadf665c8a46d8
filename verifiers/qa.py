"""Short-answer QA scoring: exact match and token F1 with the official HotpotQA / SQuAD normalisation,
plus supporting-document recall when the reader's evidence is given."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from sleuth.verifiers.base import Verdict

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)
_YES_NO = ("yes", "no", "noanswer")


def normalize_answer(s: str) -> str:
    """Lower-case, drop punctuation, drop the articles a/an/the, collapse whitespace (official script)."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    """Token-level F1. As in the official HotpotQA script, a yes/no/noanswer on either side scores 0
    unless both normalise to the same string."""
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    if (pred in _YES_NO or ref in _YES_NO) and pred != ref:
        return 0.0
    p_toks, r_toks = pred.split(), ref.split()
    common = Counter(p_toks) & Counter(r_toks)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p_toks), same / len(r_toks)
    return 2 * precision * recall / (precision + recall)


def answer_spans(answers: Sequence[str]) -> list[str]:
    """The normalised answers a document could hold as a span: not yes / no / noanswer, not empty."""
    return [a for a in map(normalize_answer, answers) if a and a not in _YES_NO]


def answer_in_text(text: str, answers: Sequence[str]) -> bool | None:
    """Whether `text` holds one of `answers` as whole normalised tokens: the answer was in front of whoever
    read it. None when no answer can be a span (see `answer_spans`)."""
    spans = answer_spans(answers)
    if not spans:
        return None
    padded = f" {normalize_answer(text)} "
    return any(f" {span} " in padded for span in spans)


def support_recall(read: Iterable[str], supporting: Sequence[str]) -> float:
    """Fraction of gold supporting titles among the documents read (1.0 when there are none)."""
    gold = set(supporting)
    return len(gold & set(read)) / len(gold) if gold else 1.0


def gold_answers(task: Any) -> list[str]:
    """Accepted answers of a Task, or of a raw record: HotpotQA `answer`, MuSiQue `answer` +
    `answer_aliases`, NQ-open `answer` as a list."""
    if hasattr(task, "answers"):
        return task.answers
    gold = task.get("answer")
    answers = list(gold) if isinstance(gold, (list, tuple)) else [gold]
    answers += list(task.get("answer_aliases") or task.get("aliases") or [])
    answers = [str(a) for a in answers if a is not None]
    if not answers:
        raise ValueError("the record has no answer field")
    return answers


class QAVerifier:
    """Scores a short answer against every accepted answer of a task (best match counts).

    `metric` picks which number becomes the reward: "f1" (default: with a small model EM is almost always
    0, so F1 keeps groups from having zero variance) or "em". Both are always reported in `details`.
    """

    def __init__(self, metric: str = "f1"):
        if metric not in ("f1", "em"):
            raise ValueError(f"metric must be 'f1' or 'em', not {metric!r}")
        self.metric = metric

    def __call__(self, task: Any, response: str, evidence: Sequence[str] | None = None, **_: Any) -> Verdict:
        answers = gold_answers(task)
        response = response or ""
        em = max(exact_match(response, a) for a in answers)
        f1 = max(token_f1(response, a) for a in answers)
        details: dict[str, Any] = {"em": em, "f1": f1, "prediction": response}
        if evidence is not None:
            # Verifiers stand apart from tasks/ (they score raw records as well as Tasks), so the gold titles are
            # read here from the payload's `supporting` list, the layout `sleuth.tasks.qa.QADocs` writes.
            payload = task.payload if hasattr(task, "payload") else task.get("payload", {})
            details["support_recall"] = support_recall(evidence, payload.get("supporting", []))
        return Verdict(score=em if self.metric == "em" else f1, details=details)
