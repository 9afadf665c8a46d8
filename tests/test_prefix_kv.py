"""The prefix KV store: longest common prefix, at most all but a prompt's last token, per weights version,
bounded in bytes (least recently used out)."""

import numpy as np
import pytest
import torch

from sleuth.agents.policies.prefix_kv import PrefixEntry, PrefixKVStore, common_prefix


def _entry(ids: list[int], layers: int = 2) -> PrefixEntry:
    n = len(ids)
    return PrefixEntry(np.asarray(ids), [torch.zeros(1, n, 4) for _ in range(layers)],
                       [torch.zeros(1, n, 4) for _ in range(layers)])


def test_common_prefix():
    assert common_prefix(np.array([1, 2, 3]), np.array([1, 2, 4, 5])) == 2
    assert common_prefix(np.array([1, 2]), np.array([1, 2, 3])) == 2
    assert common_prefix(np.array([7]), np.array([1])) == 0


def test_lookup_takes_the_longest_prefix_and_leaves_the_last_token():
    store = PrefixKVStore(1 << 20)
    short, long = _entry([1, 2]), _entry([1, 2, 3, 4])
    store.put(short, 0)
    store.put(long, 0)
    hit = store.lookup([1, 2, 3, 9], 0)
    assert hit.entry is long and hit.length == 3
    assert store.lookup([1, 2, 3, 4], 0).length == 3  # the whole prompt is kept: its last token still runs
    assert store.lookup([5, 6], 0).entry is None and store.lookup([5, 6], 0).length == 0


def test_a_new_version_drops_every_entry():
    store = PrefixKVStore(1 << 20)
    store.put(_entry([1, 2, 3]), 0)
    assert store.lookup([1, 2, 3, 4], 1).entry is None
    assert not store.entries and store.used == 0


def test_the_budget_evicts_least_recently_used_first():
    one = _entry([1, 2, 3]).nbytes  # 2 layers × (keys + values) × 3 tokens × 4 floats × 4 bytes
    assert one == 2 * 2 * 3 * 4 * 4
    store = PrefixKVStore(2 * one)
    a, b, c = _entry([1, 2, 3]), _entry([4, 5, 6]), _entry([7, 8, 9])
    store.put(a, 0)
    store.put(b, 0)
    store.lookup([1, 2, 3, 0], 0)  # a is used again: b is now the oldest
    store.put(c, 0)
    assert [e for e in store.entries.values()] == [a, c] and store.used == 2 * one
    store.put(_entry(list(range(20))), 0)  # larger than the whole budget: not kept, nothing evicted for it
    assert [e for e in store.entries.values()] == [a, c]


def test_an_entry_its_successor_extends_is_replaced():
    store = PrefixKVStore(1 << 20)
    old = _entry([1, 2, 3])
    store.put(old, 0)
    other = _entry([1, 2, 9])  # diverges: keeps serving its own prefix
    store.put(other, 0, replaces=old)
    assert old in store.entries.values()
    store.put(_entry([1, 2, 3, 4, 5]), 0, replaces=old)
    assert old not in store.entries.values() and len(store.entries) == 2
    assert store.used == sum(e.nbytes for e in store.entries.values())


def test_a_negative_budget_is_refused():
    with pytest.raises(ValueError, match="≥ 0 bytes"):
        PrefixKVStore(-1)
