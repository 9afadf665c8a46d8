"""`QAEnv`: the part every question-answering env shares. The episode ends with the `answer` tool (a short
phrase) and the QA verifier scores it with `metric` (`f1` or `em`) against the task's answer and aliases."""

from __future__ import annotations

from typing import Any

from sleuth.envs.base import ToolEnv
from sleuth.envs.tools import tool
from sleuth.verifiers.qa import QAVerifier


class QAEnv(ToolEnv):
    def __init__(self, *, metric: str = "f1", **kwargs: Any):
        self.metric = metric
        super().__init__(**kwargs)

    def default_verifier(self) -> QAVerifier:
        return QAVerifier(self.metric)

    @tool(final=True)
    def answer(self, text: str) -> str:
        """Give the final answer (a short phrase) and end the episode.

        Args:
            text: the answer
        """
        return text.strip()
