"""One episode, one group and one paired comparison as the page shows them: token texts from the run's
tokenizer, per-token quantities from what the run recorded (sampled logprobs; advantages from the training
step's credit sidecar), never recomputed here."""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

from sleuth.view.runs import Run, clean


@lru_cache(maxsize=4)
def tokenizer_for(model: str | None) -> Any:
    """The run's tokenizer where its model is available locally, else the embedded model's (`smollm2`)."""
    from sleuth.agents.policies.load import load_tokenizer
    from sleuth.agents.policies.models import EMBEDDED

    if model and Path(model).is_dir():
        try:
            return load_tokenizer(model)
        except (OSError, ValueError):
            pass
    return load_tokenizer(EMBEDDED)


class TokenTexts:
    """Each id's text as `tokenizer.decode([id])`, cached per id."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.cache: dict[int, str] = {}

    def __call__(self, ids: list[int]) -> list[dict[str, Any]]:
        out = []
        for i in ids:
            text = self.cache.get(i)
            if text is None:
                text = self.cache[i] = self.tokenizer.decode([i])
            out.append({"id": i, "text": text})
        return out


@lru_cache(maxsize=8)
def _texts(model: str | None) -> TokenTexts:
    return TokenTexts(tokenizer_for(model))


def credit(run: Run, i: int) -> list[float] | None:
    """Record `i`'s per-action-token advantages from its step's credit sidecar, if the run wrote one."""
    step = run.index.step(i)
    if step is None:
        return None
    source = run.index.sources[run.index.src[i]]
    sidecar = source.path.parent / "credit" / source.path.name
    if not sidecar.is_file():
        return None
    line = run.index.lineno[i]
    with open(sidecar, encoding="utf-8", errors="replace") as f:
        for text in f:
            try:
                row = json.loads(text)
            except ValueError:
                continue
            if row.get("line") == line:
                return [float(x) for x in row["adv"]]
    return None


def episode(run: Run, i: int) -> dict[str, Any]:
    """The contract's episode page for record `i`."""
    d = run.index.record(i)
    texts = _texts(run.model())
    adv = credit(run, i)
    row = run.index.row(i)
    turns, k = [], 0
    for t in d.get("turns") or []:
        ids = list(t.get("action_ids") or [])
        lps = list(t.get("action_logprobs") or [])
        action = texts(ids)
        for n, tok in enumerate(action):
            tok["logprob"] = lps[n] if n < len(lps) else None
            tok["adv"] = adv[k + n] if adv is not None and k + n < len(adv) else None
            tok["mismatch"] = None
        k += len(ids)
        turns.append({"action": action, "observation": texts(list(t.get("observation_ids") or [])),
                      "action_text": str(t.get("action_text") or ""),
                      "observation_text": str(t.get("observation") or ""),
                      "tool_call": t.get("tool_call"), "error": t.get("error"), "reward": t.get("reward", 0.0),
                      "read": t.get("read"), "finish_reason": t.get("finish_reason"),
                      "policy_version": t.get("policy_version")})
    n = len(run.index)
    return clean({**{key: row[key] for key in ("i", "task_id", "group", "step", "score", "reward", "stop_reason",
                                               "failed", "error")},
                  "verdict": d.get("verdict"), "prompt": texts(list(d.get("prompt_ids") or [])), "turns": turns,
                  "quantities": ["logprob"] + (["adv"] if adv is not None else []),
                  "neighbours": {"prev": i - 1 if i > 0 else None, "next": i + 1 if i + 1 < n else None}})


def group(run: Run, name: str, step: int | None) -> dict[str, Any]:
    """The members of group `name` (at `step` for a training run) with their mean advantage, and the first turn
    at which their actions differ."""
    idx = run.index
    members = [i for i in range(len(idx)) if idx.group[i] == name and (step is None or idx.step(i) == step)]
    rows, actions = [], []
    for i in members:
        adv = credit(run, i)
        rows.append({**idx.row(i), "advantage": sum(adv) / len(adv) if adv else None})
        actions.append([t.get("action_ids") for t in idx.record(i).get("turns") or []])
    diverged = None
    if len(actions) > 1:
        for k in range(max(len(a) for a in actions)):
            if len({json.dumps(a[k]) if k < len(a) else "" for a in actions}) > 1:
                diverged = k
                break
    return clean({"group": name, "step": step, "members": rows, "diverged_at": diverged})


def _per_task(run: Run) -> dict[str, dict[str, Any]]:
    """Each task's first record, mean score over its scored episodes, and whether every episode failed."""
    idx, out = run.index, {}
    scores: dict[str, list[float]] = {}
    for i in range(len(idx)):
        t = idx.task_id[i]
        entry = out.setdefault(t, {"i": i, "score": None, "failed": True})
        entry["failed"] = entry["failed"] and i in idx.errors
        if i not in idx.errors and not math.isnan(idx.score[i]):
            scores.setdefault(t, []).append(idx.score[i])
    for t, s in scores.items():
        out[t]["score"] = sum(s) / len(s)
    return out


def compare(a: Run, b: Run, kind: str) -> dict[str, Any]:
    """Two runs paired by task: B better / worse / the same, both failed, or a task in one run only. A task
    that failed in one run and was scored in the other counts for the scored one."""
    ta, tb = _per_task(a), _per_task(b)
    counts = dict.fromkeys(("better", "worse", "same", "both_failed", "only_a", "only_b"), 0)
    rows = []
    for task in sorted(set(ta) | set(tb)):
        ea, eb = ta.get(task), tb.get(task)
        delta = None
        if ea is None or eb is None:
            cat = "only_b" if ea is None else "only_a"
        elif ea["failed"] and eb["failed"]:
            cat = "both_failed"
        elif ea["score"] is not None and eb["score"] is not None:
            delta = eb["score"] - ea["score"]
            cat = "better" if delta > 0 else "worse" if delta < 0 else "same"
        else:
            cat = "better" if eb["score"] is not None else "worse" if ea["score"] is not None else "same"
        counts[cat] += 1
        if kind == "all" or kind == cat:
            rows.append({"task_id": task, "a": ea, "b": eb, "delta": delta})
    return clean({"a": a.name, "b": b.name, "counts": counts, "rows": rows})
