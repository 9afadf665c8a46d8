"""The teacher of on-policy distillation: scores the student's own trajectories, token for token.

A teacher is a frozen causal LM with the student's tokenizer (a name or directory, loaded in its own dtype,
no optimizer state, no gradients), `self`: the policy's current weights under no_grad, which costs no
second model, or a server that returns prompt logprobs (`training/distill/server_teacher.py`). It reads the
trajectory's token ids as sampled (never re-tokenised text), so async rollouts, Ray workers and agent (gateway)
episodes reach it alike.

Privileged context (`teacher_context`) is rendered as one system turn of the tokenizer's chat template and laid
before the trajectory's own ids, for the teacher's forward only: the student's prompt, its rollouts and its
update never hold it. A prefix keeps the student's ids exact (re-rendering the prompt with the context
inside would re-tokenise the episode) and is the same operation for every chat template. A trajectory that the
prefix takes past the teacher's context window gets no teacher signal (`distill/signal_share` counts them).

A teacher whose vocabulary differs from the student's is refused before any rollout: the sampled ids would
mean other strings to it. Cross-tokenizer alignment (GOLD/ULD) is not built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from sleuth.agents.trajectory import Trajectory
from sleuth.core.errors import ConfigError
from sleuth.tasks.base import Task
from sleuth.training.distill.signal import DistillConfig, TeacherTokens
from sleuth.training.rl.batch import micro_batches
from sleuth.training.rl.forward import ScoredForward
from sleuth.training.rl.update import all_max, empty_batch
from sleuth.training.zero import device


def privileged_text(task: Task, field: str) -> str:
    """The text of `teacher_context` `field` for `task`."""
    from sleuth.tasks.qa import qa_docs

    if field == "answer":
        alts = [a for a in task.answers[1:] if a]
        return f"The correct answer is: {task.answer}" + (f" (also accepted: {'; '.join(alts)})" if alts else "")
    if field == "supporting":
        docs = qa_docs(task)
        gold = set(docs.supporting)
        return "Documents that answer the question:\n\n" + "\n\n".join(
            f"{d.title}: {d.text}" for d in docs.docs if d.title in gold)
    key = field.removeprefix("payload.")
    if key not in task.payload:
        raise ConfigError(f"algorithm.distill.teacher_context {field}: task {task.id} has no payload key {key!r} "
                          f"(it has {', '.join(sorted(task.payload)) or 'none'})")
    value = task.payload[key]
    return value if isinstance(value, str) else str(value)


def turn_index(traj: Trajectory) -> np.ndarray:
    """(L,) the 1-based turn of each policy token of `traj`, 0 on every other token."""
    out = [0] * len(traj.prompt_ids)
    for k, t in enumerate(traj.turns, start=1):
        out += [k] * len(t.action_ids) + [0] * len(t.observation_ids)
    return np.asarray(out, dtype=np.int64)


def context_ids(cfg: DistillConfig, tokenizer: Any, task: Task | None) -> list[int]:
    """The privileged prefix of `task` as token ids: one system turn of `tokenizer`'s chat template ([] without
    `teacher_context`)."""
    if cfg.teacher_context is None:
        return []
    if task is None:
        raise ConfigError("algorithm.distill.teacher_context needs each trajectory's task, and one was not found")
    text = privileged_text(task, cfg.teacher_context)
    ids = tokenizer.apply_chat_template([{"role": "system", "content": text}], tokenize=True,
                                        add_generation_prompt=False)
    return list(ids["input_ids"] if isinstance(ids, Mapping) else ids)


def unscored(traj: Trajectory, k: int) -> TeacherTokens:
    """No teacher signal for `traj` (it does not fit the teacher's window); `k` top ids per position."""
    n = len(traj.token_ids())
    return TeacherTokens(torch.zeros(n), torch.zeros(n), torch.from_numpy(turn_index(traj)),
                         torch.zeros((n, k), dtype=torch.long) if k else None, torch.zeros((n, k)) if k else None)


class TeacherScorer(Protocol):
    """What the trainer asks of a teacher: its numbers for every policy token of a step's trajectories."""

    def score(self, trajs: Sequence[Trajectory], tasks: Mapping[str, Task]) -> list[TeacherTokens]: ...

    def context_ids(self, task: Task | None) -> list[int]: ...


class Teacher:
    """Scores trajectories under `forward` (the teacher's model at the teacher's temperature) in this process."""

    def __init__(self, cfg: DistillConfig, forward: ScoredForward, tokenizer: Any, pad_id: int, max_length: int,
                 micro_batch_tokens: int, on: torch.device | None = None):
        self.cfg, self.forward, self.tokenizer, self.pad_id = cfg, forward, tokenizer, pad_id
        self.max_length, self.micro_batch_tokens = max_length, micro_batch_tokens
        self.device = on or device()  # where the teacher's weights are: its forwards run there

    def context_ids(self, task: Task | None) -> list[int]:
        return context_ids(self.cfg, self.tokenizer, task)

    @torch.no_grad()
    def score(self, trajs: Sequence[Trajectory], tasks: Mapping[str, Task]) -> list[TeacherTokens]:
        """The teacher's log-probability (and top-k, for the top-k kinds) of every policy token of `trajs`.
        Every rank runs the same number of forwards (a `self` teacher under ZeRO-3 gathers in each)."""
        seen = [dataclasses.replace(t, prompt_ids=self.context_ids(tasks.get(t.task_id)) + list(t.prompt_ids))
                for t in trajs]
        fits = [i for i, t in enumerate(seen) if len(t.token_ids()) <= self.max_length]
        k = self.cfg.top_k if self.cfg.needs_topk else 0
        out = [unscored(t, k) for t in trajs]
        rows = [seen[i] for i in fits]
        batches = micro_batches(rows, [np.zeros(t.num_policy_tokens) for t in rows], self.pad_id,
                                self.micro_batch_tokens, packed=self.forward.uses_packing(),
                                share=self.forward.shares_prefix())
        dev = self.device
        for i in range(int(all_max(len(batches)))):
            b = (batches[i] if i < len(batches) else empty_batch(batches[0] if batches else None, self.pad_id)).to(dev)
            scored = self.forward(b.input_ids, b.attention_mask, b.loss_mask)
            lp = scored.logprobs(b.input_ids, b.loss_mask)[0].cpu()
            grid_ids = grid_lp = None
            if k:
                ids, lps = scored.topk(k)
                sel = b.loss_mask[:, 1:].bool().cpu()
                grid_ids = torch.zeros((*lp.shape, k), dtype=torch.long)
                grid_lp = torch.zeros((*lp.shape, k))
                grid_ids[:, 1:][sel], grid_lp[:, 1:][sel] = ids.cpu(), lps.cpu()
            for row, j in enumerate(b.index):
                src = fits[j]
                start = len(seen[src].prompt_ids) - len(trajs[src].prompt_ids)
                span = slice(start, start + len(trajs[src].token_ids()))
                out[src] = TeacherTokens(
                    logprobs=lp[row, span].clone(), signal=torch.tensor(trajs[src].loss_mask(), dtype=torch.float32),
                    turn=torch.from_numpy(turn_index(trajs[src])),
                    topk_ids=grid_ids[row, span].clone() if grid_ids is not None else None,
                    topk_logprobs=grid_lp[row, span].clone() if grid_lp is not None else None)
        return out
