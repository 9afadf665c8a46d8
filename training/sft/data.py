"""Where supervised fine-tuning data comes from, as token-exact `Trajectory` records (the loss mask is the
policy's turns; tool and env tokens never train):

- `oracle`: the scripted oracle run through the env on the training tasks (a demonstration source that
  needs no model; it teaches the harness's format and the gold reading order);
- `rejection`: k episodes per training task sampled from the current policy, kept when the verifier's score
  reaches `min_score` (expert iteration: a source that needs no stronger model);
- `trajectories`: a JSONL of trajectories as `sleuth eval` / `sleuth train` write them, kept by score;
- `chat`: chat-message records (`messages`, and `tools` where assistant messages carry `tool_calls`: TRL's
  conversational layout) from a JSONL/JSON/Parquet file or a saved `datasets` directory, replayed through the
  gateway (`agents.gateway.replay`) so they are rendered exactly as an agent's calls will be; every assistant
  message trains;
- `tool_demos`: such records made from the training tasks by `training.sft.tool_demos` (a scripted reader using
  OpenAI tools whose names, prompts and answer format vary from task to task)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sleuth.agents.trajectory import Trajectory

SOURCES = ("oracle", "rejection", "trajectories", "chat", "tool_demos")


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


def read_chats(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a chat data set as {"id", "messages", "tools"} (`tools`: None, or OpenAI tool
    definitions, a list or its JSON text)."""
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
    tools = ds["tools"] if "tools" in ds.column_names else [None] * len(ds)
    return [{"id": str(i), "messages": list(m), "tools": json.loads(t) if isinstance(t, str) else t}
            for i, m, t in zip(ids, ds["messages"], tools, strict=True)]


def replay_chats(records: Sequence[dict[str, Any]], tokenizer: Any) -> list[Trajectory]:
    """Chat records as the gateway's trajectories (a record whose history is rewritten gives several)."""
    from sleuth.agents.gateway.replay import ChatReplay

    replay = ChatReplay(tokenizer)
    try:
        return [t for r in records for t in replay.trajectories(r["id"], r["messages"], r.get("tools"))]
    finally:
        replay.close()
