"""`QAEnv`: the part every question-answering env shares. The episode ends with the `answer` tool (a short
phrase) and the QA verifier scores it with `metric` (`f1` or `em`) against the task's answer and aliases."""

from __future__ import annotations

from typing import Any

from sleuth.envs.base import ToolEnv
from sleuth.envs.tools import tool
from sleuth.verifiers.qa import QAVerifier, answer_in_text, gold_answers


class QAEnv(ToolEnv):
    def __init__(self, *, metric: str = "f1", **kwargs: Any):
        self.metric = metric
        super().__init__(**kwargs)

    def default_verifier(self) -> QAVerifier:
        return QAVerifier(self.metric)

    def holds_answer(self, text: str) -> bool | None:
        """Whether a document shown to the policy holds the task's answer (a read event's `answer`): with
        support recall, it tells a reader that never saw the answer from one that saw it and did not use it."""
        return answer_in_text(text, gold_answers(self.task)) if self.task is not None else None

    @tool(final=True)
    def answer(self, text: str) -> str:
        """Give the final answer (a short phrase) and end the episode.

        Args:
            text: the answer
        """
        return text.strip()
