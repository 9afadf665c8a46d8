"""Where supervised fine-tuning data comes from, as token-exact `Trajectory` records (the loss mask is the
policy's turns; tool and env tokens never train):

- `oracle`: the scripted oracle run through the env on the training tasks (a demonstration source that
  needs no model; it teaches the harness's format and the gold reading order);
- `rejection`: k episodes per training task sampled from the current policy, kept when the verifier's score
  reaches `min_score` (expert iteration: a source that needs no stronger model);
- `trajectories`: a JSONL of trajectories as `sleuth eval` / `sleuth train` write them, kept by score;
- `chat`: chat-message records (`messages`, TRL's conversational layout) from a JSONL/JSON/Parquet file or
  a saved `datasets` directory, rendered with the policy's chat template; every assistant message trains."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sleuth.agents.chat import ChatRenderer
from sleuth.agents.trajectory import Trajectory, Turn

SOURCES = ("oracle", "rejection", "trajectories", "chat")


def score(traj: Trajectory) -> float:
    """The verifier's score of an episode (its reward where no verdict was recorded)."""
    return traj.verdict.score if traj.verdict is not None else float(traj.reward)


def accepted(trajs: Sequence[Trajectory], min_score: float) -> list[Trajectory]:
    """The episodes that ran, produced policy tokens and scored at least `min_score`, in order."""
    return [t for t in trajs if not t.failed and t.num_policy_tokens > 0 and score(t) >= min_score]


def read_trajectories(path: str | Path) -> list[Trajectory]:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"trajectory file not found: {p}")
    out = []
    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(Trajectory.from_json(line))
            except (json.JSONDecodeError, TypeError, ValueError, KeyError) as e:
                raise ValueError(f"{p}:{n} is not a trajectory ({type(e).__name__}: {e})") from None
    return out


def read_chats(path: str | Path) -> list[tuple[str, list[dict[str, Any]]]]:
    """(record id, messages) for every record of a chat data set."""
    import datasets

    p = Path(path)
    if p.is_dir():
        ds = datasets.load_from_disk(str(p))
    elif p.is_file():
        kind = "parquet" if p.suffix == ".parquet" else "json"
        ds = datasets.load_dataset(kind, data_files=str(p), split="train")
    else:
        raise FileNotFoundError(f"chat data not found: {p}")
    if "messages" not in ds.column_names:
        raise ValueError(f"{p}: chat records need a 'messages' column; found {ds.column_names}")
    ids = ds["id"] if "id" in ds.column_names else [f"chat-{i}" for i in range(len(ds))]
    return [(str(i), list(m)) for i, m in zip(ids, ds["messages"], strict=True)]


def chat_to_trajectory(messages: Sequence[dict[str, Any]], renderer: ChatRenderer, record_id: str) -> Trajectory:
    """A trajectory whose turns are the record's assistant messages (content ids + the end-of-turn id, as a
    policy would have sampled them) and whose observations are what the template puts between them."""
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    if first is None or first == 0:
        raise ValueError(f"chat record {record_id}: needs a prompt message followed by at least one assistant message")
    tok = renderer.tokenizer
    eos = tok.eos_token_id if isinstance(tok.eos_token_id, int) else tok.eos_token_id[0]
    traj = Trajectory(record_id, "chat", renderer.prompt_ids(list(messages[:first])), group=record_id)
    i = first
    while i < len(messages):
        content = messages[i].get("content")
        if not isinstance(content, str):
            raise ValueError(f"chat record {record_id}: message {i} has no text content")
        ids = tok(content, add_special_tokens=False)["input_ids"] + [eos]
        j = i + 1
        while j < len(messages) and messages[j].get("role") != "assistant":
            j += 1
        turn = Turn(ids, [0.0] * len(ids), content)
        if j < len(messages):  # what the template renders between this reply and the next one
            between = [{"role": m["role"], "content": m["content"]} for m in messages[i + 1:j]]
            turn.observation = "\n".join(m["content"] for m in between)
            turn.observation_ids = renderer.observation_ids(between, ids)
        traj.turns.append(turn)
        i = j
    traj.terminated, traj.stop_reason = True, "final"
    return traj
