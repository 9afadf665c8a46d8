"""The Tinker server's worker runs sample calls that arrive in a row with the same weights and parameters as one
generation, and each call's answer is what it would have been alone."""

from __future__ import annotations

import threading

import pytest

from sleuth.servers.tinker.service import Jobs, SampleCall


def _call(prompt, seed=None, weights=None):
    return SampleCall(weights, tuple(prompt), 2, (8, 1.0, 1.0, -1, None, seed), 0, False)


def test_queued_sample_calls_with_one_key_run_as_one_batch():
    batches, release = [], threading.Event()
    jobs = Jobs(lambda calls: (batches.append([c.prompt for c in calls]), [b"x"] * len(calls))[1])
    first = jobs.submit(lambda: release.wait(10) and {}, None)  # holds the worker while the calls queue up
    ids = [jobs.submit(_call([1, 2]), None), jobs.submit(_call([3]), None), jobs.submit(_call([4, 5, 6]), None),
           jobs.submit(_call([7], seed=3), None), jobs.submit(_call([8]), None)]
    release.set()
    for rid in [first, *ids]:
        assert jobs.get(rid).done.wait(10)
    # three in a row with one key together; a seeded call alone (its own random stream); then the next one
    assert batches == [[(1, 2), (3,), (4, 5, 6)], [(7,)], [(8,)]]
    assert all(jobs.get(rid).result == b"x" for rid in ids)


def test_a_failing_call_in_a_batch_fails_alone():
    def run(calls):
        if any(c.prompt == (0,) for c in calls):
            raise ValueError("bad prompt")
        return [b"ok"] * len(calls)

    release = threading.Event()
    jobs = Jobs(run)
    jobs.submit(lambda: release.wait(10) and {}, None)
    good, bad = jobs.submit(_call([1]), None), jobs.submit(_call([0]), None)
    release.set()
    assert jobs.get(good).done.wait(10) and jobs.get(bad).done.wait(10)
    assert jobs.get(good).result == b"ok"
    assert jobs.get(bad).error == "ValueError: bad prompt" and jobs.get(bad).category == "server"


def test_a_batch_of_prompts_of_different_lengths_samples_each_as_alone(tiny_model_dir):
    """Left-padded rows: greedy tokens and their logprobs match each prompt generated on its own."""
    from sleuth.servers.tinker.lora import LoraModels

    models = LoraModels(tiny_model_dir, "local/tiny")
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15]]
    together = models.sample(None, prompts, [1, 2, 1], 5, 0.0, 1.0, -1, [], None)
    for prompt, rows in zip(prompts, together, strict=True):
        alone = models.sample(None, [prompt], [1], 5, 0.0, 1.0, -1, [], None)[0][0]
        for row in rows:
            assert row.tokens == alone.tokens
            assert row.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
