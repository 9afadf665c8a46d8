"""TRL: a `reward_funcs` entry for `GRPOTrainer`.

TRL (1.16, `GRPOTrainer._calculate_rewards`) calls each reward function as
`f(prompts=..., completions=..., completion_ids=..., **columns)`, where every dataset column other
than the prompt comes as a list with one value per completion, plus `trainer_state`, `log_extra`,
`log_metric`. Completions are strings, or lists of message dicts for conversational data. The function
returns one float per completion (None = not applicable).

    from sleuth.verifiers.adapters import trl_reward
    trainer = GRPOTrainer(model=..., reward_funcs=[trl_reward("qa")], train_dataset=ds)  # ds has an `answer` column
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sleuth.verifiers.registry import VERIFIERS, verdict

_TRAINER_KWARGS = {"trainer_state", "log_extra", "log_metric", "environments", "completion_ids"}


def _text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):  # conversational: the assistant messages of the completion
        return "\n".join(m.get("content") or "" for m in completion if m.get("role", "assistant") == "assistant")
    raise TypeError(f"a completion must be a string or a list of messages, got {type(completion).__name__}")


def trl_reward(verifier: str = "qa", extract: bool = True, name: str | None = None) -> Callable[..., list[float]]:
    """A TRL reward function scoring each completion with a sleuth verifier against its own dataset row.
    Rows are the dataset's columns (e.g. HotpotQA's `answer`; MBPP's `test_list`, `test_setup_code`)."""
    VERIFIERS.get(verifier)  # an unknown name fails here, with the closest known one

    def reward(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:
        log_metric = columns.get("log_metric")
        rows = {k: v for k, v in columns.items() if k not in _TRAINER_KWARGS}
        scores: list[float | None] = []
        for i, completion in enumerate(completions):
            record = {k: v[i] for k, v in rows.items()}
            try:
                scores.append(verdict(verifier, record, _text(completion), extract).score)
            except (KeyError, ValueError):  # the row lacks what this verifier needs: not applicable
                scores.append(None)
        if log_metric is not None:
            done = [s for s in scores if s is not None]
            log_metric(f"sleuth_{verifier}/scored_fraction", len(done) / max(1, len(scores)))
        return scores

    reward.__name__ = name or f"sleuth_{verifier}"
    return reward
