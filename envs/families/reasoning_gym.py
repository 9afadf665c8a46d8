"""`reasoning_gym:<dataset>`: one of reasoning-gym's procedural datasets as a one-turn env. Its generator is the
task source (the episode seed is the item index, so `seeds:` ranges are disjoint sets of questions), its
`score_answer` is the verifier, applied to what the reply puts between `<answer>` tags (reasoning-gym's own
`extract_answer`; a reply without them scores as no answer, by that scorer's rules).

`env_args`: `size` and `seed` of the dataset (an item depends on seed + index), `answer` (`tags`: what the
reply puts between `<answer>` tags, reasoning-gym's own protocol; `reply`: the whole reply, stripped, for a small
model that writes no tags, which reasoning-gym's scorers then grade, e.g. partial credit for a reply that
contains the answer), `system_prompt` (a key of reasoning-gym's `SYSTEM_PROMPTS` or a text; default: `direct`
for tags, an answer-only instruction for reply), and any field of the dataset's own config (e.g. `min_terms`,
`max_digits` for `chain_sum`).

A user's own dataset, a `ProceduralDataset` subclass with its config dataclass, registered with
`register_dataset(name, DatasetCls, ConfigCls)` when its module is imported (as reasoning-gym's own datasets are), is
`reasoning_gym:<module>:<name>`: sleuth imports the module, then creates the dataset by name. A reset with neither
seed nor task draws an item index below `size`."""

from __future__ import annotations

import functools
from typing import Any

from sleuth.envs.families.base import Move, TextGameEnv, registered, require
from sleuth.envs.outcome import ResetInfo
from sleuth.envs.parsers import ToolCall
from sleuth.tasks.base import Task
from sleuth.tasks.seeds import task_seed
from sleuth.verifiers.base import Verdict

# Larger than every named seed range (`tasks/seeds.py`), so a training seed indexes an item: most datasets
# generate item i from Random(seed + i) on demand and never look at `size`; one that pre-generates `size`
# items takes a smaller `size` in env_args.
DEFAULT_SIZE = 2_000_000
REPLY_PROMPT = "Reply with the final answer only: no words, no working."
ANSWER_MODES = ("tags", "reply")


def dataset_names() -> list[str]:
    return sorted(require("reasoning_gym", "reasoning_gym", "reasoning-gym").factory.DATASETS)


@functools.lru_cache(maxsize=32)
def _dataset(name: str, frozen_config: tuple[tuple[str, Any], ...]) -> Any:
    rg = require("reasoning_gym", "reasoning_gym", "reasoning-gym")
    return rg.create_dataset(registered(name, rg.factory.DATASETS), **dict(frozen_config))


def _freeze(config: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in config.items()))


class ReasoningGymEnv(TextGameEnv):
    family = "reasoning_gym"

    def __init__(self, dataset: str, *, size: int = DEFAULT_SIZE, seed: int = 0, answer: str = "tags",
                 system_prompt: str | None = None, **kwargs: Any):
        rg = require("reasoning_gym", "reasoning_gym", "reasoning-gym")
        if answer not in ANSWER_MODES:
            raise ValueError(f"answer must be one of {', '.join(ANSWER_MODES)}, got {answer!r}")
        own = {k: kwargs.pop(k) for k in ("harness", "max_turns", "tasks") if k in kwargs}
        prompt = system_prompt or ("direct" if answer == "tags" else REPLY_PROMPT)
        super().__init__(dataset, system_prompt=rg.utils.SYSTEM_PROMPTS.get(prompt, prompt), **own)
        self.answer_mode = answer
        self.config = {"size": size, "seed": seed, **kwargs}  # the dataset's own config keys are checked by it
        self.dataset = _dataset(dataset, _freeze(self.config))
        self.entry: dict[str, Any] | None = None

    def env_args(self) -> dict[str, Any]:
        return {"dataset": self.env_id, "answer": self.answer_mode, **self.config}

    def seed_count(self) -> int:
        """A seed is an item index: the dataset has `size` items."""
        return self.config["size"]

    def begin(self, task: Task, seed: int) -> Move:
        if not 0 <= seed < self.config["size"]:
            raise ValueError(f"seed {seed} is outside the dataset's {self.config['size']} items (env_args size)")
        self.entry = self.dataset[seed]
        return Move(self.entry["question"])

    def advance(self, action: str) -> Move:
        from reasoning_gym.utils import extract_answer

        self.answer = extract_answer(action) if self.answer_mode == "tags" else action.strip()
        self.score = float(self.dataset.score_answer(self.answer, self.entry))
        return Move("", reward=self.score, terminated=True)

    def verdict(self) -> Verdict:
        return Verdict(self.score, {"extracted": self.answer, "answer": self.entry["answer"],
                                    "format_ok": float(self.answer is not None), "turns": self.turn})

    @classmethod
    def oracle(cls, task: Task, turn: int, start: ResetInfo) -> ToolCall:
        """The item's reference answer, regenerated from the env's arguments (in the answer tags where they count)."""
        args = dict(start.env_args)
        dataset, mode = args.pop("dataset"), args.pop("answer")
        gold = _dataset(dataset, _freeze(args))[task_seed(task)]["answer"]
        return ToolCall("answer", {"text": f"<answer>{gold}</answer>" if mode == "tags" else gold})


def make(env_id: str, **env_args: Any) -> ReasoningGymEnv:
    return ReasoningGymEnv(env_id, **env_args)
