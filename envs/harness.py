"""The harness: everything between the model's text and the env's tools — the tool-call format, the
system prompt, and the turn budget. Swapping the harness never changes the task or the verifier."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sleuth.envs.parsers import ToolCallParser, get_parser
from sleuth.envs.tools import Tool


@dataclass
class Harness:
    """`budget` counts the non-final turns (tool calls and malformed replies alike); after it is spent
    the model gets one last turn to call a final tool, else the episode is truncated."""

    parser: ToolCallParser = field(default_factory=lambda: get_parser("json"))
    budget: int = 3
    budget_unit: str = "turns"
    max_observation_chars: int = 4000

    def __post_init__(self) -> None:
        self.parser = get_parser(self.parser)
        if self.budget < 0:
            raise ValueError(f"budget must be >= 0, got {self.budget}")

    @property
    def format(self) -> str:
        return self.parser.name

    def system_message(self, instructions: str, tools: Mapping[str, Tool]) -> str:
        return f"{instructions.strip()}\n\n{self.parser.instructions(tools)}"

    def budget_note(self, left: int, finals: list[str]) -> str:
        if left > 0:
            return f"({left} {self.budget_unit} left)"
        return f"(no {self.budget_unit} left: call {' or '.join(finals)} now)"

    def clip(self, text: str) -> str:
        """Cut an observation to the harness's size and wrap it the way its format expects."""
        if len(text) > self.max_observation_chars:
            cut = len(text) - self.max_observation_chars
            text = text[: self.max_observation_chars] + f"\n[... truncated {cut} characters]"
        return self.parser.wrap(text)
