"""OpenRLHF: a reward function file and the remote reward-model protocol.

OpenRLHF 0.11 (`openrlhf.utils.agent.SingleTurnAgentExecutor._fetch_rewards_via_http`) POSTs to the
URL exactly as given (`--reward.remote_url`) the JSON `{"query": [prompt + response, decoded with special
tokens], "prompts": [prompt], "labels": [label]}` and reads `{"rewards": [...], "scores": [...],
"extra_logs": {...}}`; a URL ending in `.py` instead loads `reward_func(queries, prompts, labels)`
returning the same dict. Errors there become a None reward silently, so this side never fails
silently: a malformed request gets a 4xx with a message (`sleuth serve verifier`).

Labels: for QA the gold answer (or a JSON list of answers); for code the JSON of the row's test fields;
for swe the JSON of the task record (the response is a unified diff). A pointwise judge (`judge:FILE`) is shown
the prompt as the question.
"""

from __future__ import annotations

import json
import os
from typing import Any


def _label_record(verifier: str, label: Any, prompt: str = "") -> dict[str, Any]:
    if isinstance(label, str) and label.strip()[:1] in "[{":
        try:
            label = json.loads(label)
        except json.JSONDecodeError:
            pass
    if verifier in ("code", "swe"):
        if not isinstance(label, dict):
            raise ValueError(f"a {verifier} label must be the JSON object of the row's fields (tests / task record)")
        return label
    return {"answer": label if isinstance(label, list) else str(label), "question": prompt}


def _response(query: str, prompt: str) -> str:
    if not query.startswith(prompt):
        raise ValueError("each query must start with its prompt (OpenRLHF sends prompt + response)")
    response = query[len(prompt):]
    for marker in ("<|im_end|>", "<|endoftext|>", "</s>", "<|eot_id|>"):  # decoded with special tokens
        response = response.split(marker)[0]
    return response


def openrlhf_rewards(verifier: str, queries: list[str], prompts: list[str], labels: list[Any]) -> dict[str, Any]:
    from sleuth.verifiers.registry import verdict

    if not (len(queries) == len(prompts) == len(labels)):
        raise ValueError(f"query, prompts and labels differ in length: {len(queries)}, {len(prompts)}, {len(labels)}")
    verdicts = [verdict(verifier, _label_record(verifier, lab, p), _response(q, p))
                for q, p, lab in zip(queries, prompts, labels, strict=True)]
    scores = [v.score for v in verdicts]
    return {"rewards": scores, "scores": scores,
            "extra_logs": {f"sleuth_{verifier}_mean": sum(scores) / len(scores) if scores else 0.0}}


def reward_func(queries: list[str], prompts: list[str], labels: list[Any]) -> dict[str, Any]:
    """The `.py` form of `--reward.remote_url`; the verifier is `$SLEUTH_VERIFIER` (default "qa")."""
    return openrlhf_rewards(os.environ.get("SLEUTH_VERIFIER", "qa"), queries, prompts, labels)
