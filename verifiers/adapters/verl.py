"""verl: a `custom_reward_function`.

verl (0.9, `verl/trainer/ppo/reward.py::get_custom_reward_fn`) imports the file named by
`reward.custom_reward_function.path` and takes the function named by `.name` (default `compute_score`);
the naive reward manager calls it per sample with keyword arguments `data_source`, `solution_str` (the
decoded response, special tokens skipped), `ground_truth` (`reward_model.ground_truth` of the row),
`extra_info` (plus any `reward_kwargs`); `main_eval.py` calls it positionally with the first three. It
returns a float or a dict with a `score` key (other keys are logged as extra info).

Config:
    reward:
      custom_reward_function:
        path: <site-packages>/sleuth/verifiers/adapters/verl.py
        name: compute_score

`ground_truth`: for QA the answer (a string or a list of accepted answers); for code the test fields of
the row (a dict, or its JSON string: MBPP's `test_list` / `test_setup_code` or HumanEval's `test` /
`entry_point`); for swe the task record (dict or JSON; the response is a unified diff). Which verifier runs
comes from `extra_info["verifier"]` (a registered name or `judge:FILE`, a pointwise judge), else the data
source name ("swe..." → swe, mbpp/humaneval → code). verl passes no prompt: a judge is shown
`extra_info["question"]`, so put the question there in the data set.
"""

from __future__ import annotations

import json
from typing import Any

_CODE_SOURCES = ("mbpp", "humaneval", "openai_humaneval", "code")


def _record(verifier: str, ground_truth: Any, question: str = "") -> dict[str, Any]:
    if verifier in ("code", "swe"):
        gt = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
        if not isinstance(gt, dict):
            raise ValueError(f"{verifier} ground_truth must be a dict (or JSON) of the row's fields")
        return gt
    answer = list(ground_truth) if isinstance(ground_truth, (list, tuple)) else str(ground_truth)
    return {"answer": answer, "question": question}


def _verifier_of(source: str) -> str:
    if source.startswith("swe"):
        return "swe"
    return "code" if source.split("/")[-1] in _CODE_SOURCES else "qa"


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None,
                  **kwargs: Any) -> dict[str, Any]:
    from sleuth.verifiers.registry import verdict

    extra = extra_info or {}
    verifier = extra.get("verifier") or kwargs.get("verifier") or _verifier_of(str(data_source).lower())
    v = verdict(verifier, _record(verifier, ground_truth, str(extra.get("question") or "")), solution_str or "")
    out: dict[str, Any] = {"score": float(v.score)}
    out.update({k: float(val) for k, val in v.details.items() if isinstance(val, (int, float))})
    return out
