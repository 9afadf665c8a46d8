"""The order tasks are trained on: a seeded permutation per epoch and a cursor, so a resumed run continues
with exactly the tasks the killed run would have seen next."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass
class TaskSampler:
    n: int
    seed: int = 0
    epoch: int = 0
    cursor: int = 0

    def __post_init__(self) -> None:
        if self.n <= 0:
            raise ValueError("no tasks to train on")

    def order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.n)

    def take(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            perm = self.order(self.epoch)
            take = perm[self.cursor:self.cursor + k - len(out)].tolist()
            out += take
            self.cursor += len(take)
            if self.cursor >= self.n:
                self.epoch, self.cursor = self.epoch + 1, 0
        return out

    def state(self) -> dict[str, int]:
        return {k: v for k, v in asdict(self).items() if k in ("epoch", "cursor")}

    def load(self, state: dict[str, int]) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
