"""Key/value states of earlier generate calls, found again by token prefix: an episode's next turn is its
last prompt + its generated ids + the env's reply, so the transformers engine need only prefill the reply.

Entries are content-addressed (the longest common prefix of token ids, as vLLM's prefix cache and SGLang's
radix cache are), not tied to an episode: under causal attention the states of a prompt's first k tokens
depend only on those k tokens, so any common prefix is exact. An entry belongs to one weights version: a
weight sync makes every entry stale and they are dropped. The store is bounded in bytes, least recently
used first out."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(eq=False)  # entries are compared by identity (their ids are arrays)
class PrefixEntry:
    ids: np.ndarray  # the token ids whose states are kept
    keys: list[torch.Tensor]  # per layer: (heads, len(ids), head_dim)
    values: list[torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


@dataclass
class PrefixHit:
    entry: PrefixEntry | None
    length: int  # tokens of the prompt whose states come from the entry (0 without one)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


class PrefixKVStore:
    def __init__(self, budget_bytes: int):
        if budget_bytes < 0:
            raise ValueError(f"the prefix KV budget must be ≥ 0 bytes, got {budget_bytes}")
        self.budget = budget_bytes
        self.entries: OrderedDict[int, PrefixEntry] = OrderedDict()
        self.version: int | None = None
        self.used = 0
        self._next = 0

    def _clear(self) -> None:
        self.entries.clear()
        self.used = 0

    def lookup(self, prompt: list[int], version: int) -> PrefixHit:
        """The entry sharing the longest prefix with `prompt`, at most all but its last token (generate must
        run the last one to get the next token's logits)."""
        if version != self.version:
            self._clear()
            self.version = version
        ids = np.asarray(prompt)
        best, length = None, 0
        for key, entry in self.entries.items():
            n = min(common_prefix(entry.ids, ids), len(prompt) - 1)
            if n > length:
                best, length = key, n
        if best is None:
            return PrefixHit(None, 0)
        self.entries.move_to_end(best)
        return PrefixHit(self.entries[best], length)

    def put(self, entry: PrefixEntry, version: int, replaces: PrefixEntry | None = None) -> None:
        """Keep `entry`; `replaces` is dropped when `entry` starts with all of its ids (it can serve nothing
        the new one cannot)."""
        if version != self.version:
            self._clear()
            self.version = version
        if replaces is not None and len(replaces.ids) <= len(entry.ids) \
                and common_prefix(replaces.ids, entry.ids) == len(replaces.ids):
            for key, e in list(self.entries.items()):
                if e is replaces:
                    self.used -= e.nbytes
                    del self.entries[key]
        size = entry.nbytes
        if size > self.budget:
            return
        while self.entries and self.used + size > self.budget:
            _, old = self.entries.popitem(last=False)
            self.used -= old.nbytes
        self.entries[self._next] = entry
        self._next += 1
        self.used += size
