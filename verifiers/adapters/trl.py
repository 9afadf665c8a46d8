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

import json
from collections.abc import Callable
from typing import Any

from sleuth.verifiers.base import GroupVerifier
from sleuth.verifiers.registry import get_verifier, group_verifier, verdict

_TRAINER_KWARGS = {"trainer_state", "log_extra", "log_metric", "environments", "completion_ids"}


def _text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):  # conversational: the assistant messages of the completion
        return "\n".join(m.get("content") or "" for m in completion if m.get("role", "assistant") == "assistant")
    raise TypeError(f"a completion must be a string or a list of messages, got {type(completion).__name__}")


def _question(prompt: Any) -> str:
    """The question a judge is shown: the prompt's last user message (conversational data) or the prompt."""
    if isinstance(prompt, list):
        users = [m.get("content") or "" for m in prompt if m.get("role") == "user"]
        return str(users[-1]) if users else ""
    return str(prompt)


def trl_reward(verifier: str = "qa", extract: bool = True, name: str | None = None) -> Callable[..., list[float]]:
    """A TRL reward function scoring each completion with a sleuth verifier against its own dataset row.
    Rows are the dataset's columns (e.g. HotpotQA's `answer`; MBPP's `test_list`, `test_setup_code`), plus the
    prompt as `question` (what a judge is shown). A group judge (`judge:FILE`, mode group) scores the
    completions of one prompt together, in one call. A judge that gives no usable answer raises
    (`JudgeUnavailable`): TRL would read a None as "not applicable" and train on the other rewards alone."""
    group = group_verifier(verifier)  # an unknown name fails here, with the closest known one
    if group is None:
        get_verifier(verifier)

    def reward(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:
        log_metric = columns.get("log_metric")
        rows = {k: v for k, v in columns.items() if k not in _TRAINER_KWARGS}
        records = [{**{k: v[i] for k, v in rows.items()}, "question": _question(prompts[i])}
                   for i in range(len(completions))]
        texts = [_text(c) for c in completions]
        if group is not None:
            scores: list[float | None] = _grouped(group, prompts, records, texts)
        else:
            scores = [_one(verifier, record, text, extract) for record, text in zip(records, texts, strict=True)]
        if log_metric is not None:
            done = [s for s in scores if s is not None]
            log_metric(f"sleuth_{verifier}/scored_fraction", len(done) / max(1, len(scores)))
        return scores

    reward.__name__ = name or f"sleuth_{verifier}"
    return reward


def _one(verifier: str, record: dict[str, Any], text: str, extract: bool) -> float | None:
    try:
        return verdict(verifier, record, text, extract).score
    except (KeyError, ValueError):  # the row lacks what this verifier needs: not applicable
        return None


def _grouped(judge: GroupVerifier, prompts: list[Any], records: list[dict[str, Any]],
             texts: list[str]) -> list[float | None]:
    """Completions of one prompt (TRL puts a prompt's `num_generations` in one batch) scored together."""
    by_prompt: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        by_prompt.setdefault(json.dumps(p, sort_keys=True, default=str), []).append(i)
    scores: list[float | None] = [None] * len(texts)
    for idx in by_prompt.values():
        verdicts = judge.score_group(records[idx[0]], [texts[i] for i in idx], [{} for _ in idx])
        for i, v in zip(idx, verdicts, strict=True):
            scores[i] = v.score
    return scores
