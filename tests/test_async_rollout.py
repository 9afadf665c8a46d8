"""Asynchronous training with bounded staleness: the weights gate, the staleness bound and its drop
count, partial rollouts whose turns carry two versions (and the loss's per-turn behaviour logprobs),
the weight-sync timeout, and the trainer end to end."""

import threading
import time

import numpy as np
import pytest
import torch

import sleuth
from sleuth.agents.loop.episodes import run_episodes
from sleuth.agents.policies.base import Generation, SamplingParams
from sleuth.agents.policies.load import load_policy
from sleuth.agents.policies.requests import WeightsGate
from sleuth.training.rl.batch import build_batch
from sleuth.training.rl.losses import importance_weights
from sleuth.training.rollout.asynchronous import RolloutStream


def test_an_update_waits_for_calls_in_flight_and_holds_new_ones_back():
    gate, order = WeightsGate(), []
    in_call, release = threading.Event(), threading.Event()

    def call(name, hold):
        with gate.call():
            order.append(f"{name} in")
            in_call.set()
            if hold:
                release.wait(5)
            order.append(f"{name} out")

    first = threading.Thread(target=call, args=("a", True))
    first.start()
    in_call.wait(5)

    def update():
        with gate.update(5):
            order.append("update")

    up = threading.Thread(target=update)
    up.start()
    time.sleep(0.1)
    late = threading.Thread(target=call, args=("b", False))  # arrives while the update waits
    late.start()
    time.sleep(0.1)
    assert order == ["a in"]  # the update waits for a; b waits for the update
    release.set()
    for t in (first, up, late):
        t.join(5)
    assert order == ["a in", "a out", "update", "b in", "b out"]


def test_an_update_that_cannot_get_the_gate_times_out_and_frees_it():
    gate, release, inside = WeightsGate(), threading.Event(), threading.Event()

    def held():
        with gate.call():
            inside.set()
            release.wait(5)

    t = threading.Thread(target=held)
    t.start()
    inside.wait(5)
    with pytest.raises(TimeoutError, match="1 generate call"), gate.update(0.2):
        pass
    with gate.call():  # a timed-out update holds nothing back
        pass
    release.set()
    t.join(5)


def stream_of(hotpot_tasks, policy, max_staleness=1, group_size=2):
    it = iter(range(10**6))
    return RolloutStream(lambda: sleuth.make("DocRead-v0", harness="text"),
                         lambda: [hotpot_tasks[next(it) % len(hotpot_tasks)] for _ in range(2)], policy,
                         SamplingParams(), group_size=group_size, concurrency=4, max_staleness=max_staleness)


def wait_for(pred, timeout=10.0):
    end = time.time() + timeout
    while not pred():
        assert time.time() < end, "timed out"
        time.sleep(0.01)


def test_staleness_bound_drops_and_counts_exactly_the_stale_groups(hotpot_tasks):
    policy = load_policy("oracle")
    s = stream_of(hotpot_tasks, policy, max_staleness=1)
    try:
        first = s.take(2, version=0)
        assert len(first.trajs) == 4 and first.stats.dropped == 0 and first.stats.staleness == [0] * 4
        assert len({t.group for t in first.trajs}) == 2  # one label per group
        wait_for(lambda: len(s.ready) == 2)  # step 1 sampled at version 0; the feed stops there (1 ahead)
        time.sleep(0.1)
        assert s.issued_steps - s.taken_steps == 1 and len(s.ready) == 2
        policy.version = 2  # two updates later, the waiting step is 2 versions old
        stale = s.take(2, version=2)
        assert stale.trajs == [] and stale.stats.dropped == 4
        fresh = s.take(2, version=2)  # sampled after the bump
        assert len(fresh.trajs) == 4 and fresh.stats.dropped == 0 and max(fresh.stats.staleness) == 0
        assert all(t.reward == 1.0 for t in fresh.trajs)
    finally:
        s.close()


def test_a_group_with_a_failed_episode_is_set_apart_and_sampled_once_more(hotpot_tasks):
    """A task whose documents are gone fails at reset: its group comes back in `failed` (to be recorded and
    counted), never in `trajs` (to be trained); it is issued once more at once (an outage may have passed),
    fails again, and that second try takes the group's place in the step."""
    from sleuth.tasks.base import Task

    good, cut = hotpot_tasks[0], Task(id="cut", question="q?", answer="a", payload={})
    it = iter(range(10**6))
    s = RolloutStream(lambda: sleuth.make("DocRead-v0", harness="text"),
                      lambda: [good, cut] if next(it) % 2 == 0 else [good, good], load_policy("oracle"),
                      SamplingParams(), group_size=2, concurrency=4, max_staleness=1)
    try:
        first = s.take(2, version=0)
        assert [t.task_id for t in first.trajs] == [good.id] * 2 and first.stats.staleness == [0, 0]
        assert [t.task_id for t in first.failed] == ["cut"] * 4 and first.reissued == 1
        assert all(t.failed and t.stop_reason == "reset_error" for t in first.failed)
        assert len({t.group for t in first.failed}) == 2 and first.stats.dropped == 0
        second = s.take(2, version=0)  # the next step's tasks: two good groups, nothing re-issued
        assert len(second.trajs) == 4 and second.failed == [] and second.reissued == 0
    finally:
        s.close()


class Pausing:
    """The oracle, pausing its second turn until released; logprob −(version + 1) on every id."""

    max_context, parallel_calls, name = None, 1, "pausing"

    def __init__(self):
        self.inner = load_policy("oracle")
        self.tokenizer, self.version = self.inner.tokenizer, 0
        self.at_turn_1, self.release = threading.Event(), threading.Event()

    def generate(self, requests, sampling):
        if any(r.turn == 1 for r in requests):
            self.at_turn_1.set()
            self.release.wait(5)
        gens = self.inner.generate(requests, sampling)
        return [Generation(g.ids, [-(self.version + 1.0)] * len(g.ids), g.text) for g in gens]


def test_a_partial_rollout_records_both_versions_and_the_loss_uses_each_turns_logprobs(hotpot_tasks):
    policy, gate = Pausing(), WeightsGate()
    out = []
    runner = threading.Thread(target=lambda: out.extend(run_episodes(
        lambda: sleuth.make("DocRead-v0", harness="text"), hotpot_tasks[:1], policy, gate=gate)))
    runner.start()
    policy.at_turn_1.wait(5)  # turn 0 done at version 0; turn 1's call is in flight

    def update():
        with gate.update(5):
            policy.version += 1

    up = threading.Thread(target=update)
    up.start()
    time.sleep(0.1)
    policy.release.set()  # the call in flight finishes at version 0, the update runs, later turns get version 1
    up.join(5)
    runner.join(10)
    [traj] = out
    versions = [t.policy_version for t in traj.turns]
    assert versions[:2] == [0, 0] and set(versions[2:]) == {1} and len(versions) >= 3
    assert all(lp == -(t.policy_version + 1.0) for t in traj.turns for lp in t.action_logprobs)
    # π_behaviour per token is its own turn's: a TIS weight exp(π_old − π_behaviour) differs across the versions
    b = build_batch([traj], [np.ones(traj.num_policy_tokens)], pad_id=0)
    on = b.loss_mask.bool()
    expected = torch.tensor([lp for t in traj.turns for lp in t.action_logprobs])
    assert torch.equal(b.sampling_logprobs[on], expected)
    old = torch.full_like(b.sampling_logprobs, -1.5)
    w = importance_weights(old, b.sampling_logprobs, b.loss_mask, "tis", "token", float("inf")).weight[on]
    n0 = sum(len(t.action_ids) for t in traj.turns[:2])
    assert (torch.allclose(w[:n0], torch.tensor(float(np.exp(-0.5))))
            and torch.allclose(w[n0:], torch.tensor(float(np.exp(0.5)))))


def _cfg(tiny_model_dir, out, **over):
    from sleuth.training.config import load_config

    base = {"model": tiny_model_dir, "out": str(out), "env_args": {"harness": "text"}, "task_limit": 24,
            "rollout.max_tokens": 12, "rollout.tasks_per_step": 2, "rollout.group_size": 2, "rollout.temperature": 0.7,
            "rollout.max_staleness": 1, "loss.rollout_is": "tis", "checkpoint.export_hf": False,
            "tensorboard": False, "deepspeed.lr": 1e-3, "loss.entropy_coef": 0.01}
    base.update(over)
    return load_config(overrides=base)


@pytest.mark.parametrize("over, message", [
    ({"loss.rollout_is": "none"}, "behaviour logprobs"),
    ({"rollout.zero_variance": "dynamic"}, "dynamic"),
    ({"rollout.max_staleness": -1}, "max_staleness must be ≥ 0"),
])
def test_async_configs_that_cannot_work_are_refused(tiny_model_dir, tmp_path, over, message):
    with pytest.raises(ValueError, match=message):
        _cfg(tiny_model_dir, tmp_path, **over)


def test_async_trainer_keeps_samples_within_the_bound_and_times_out_a_blocked_sync(tiny_model_dir, tmp_path):
    from sleuth.training.rl.trainer import Trainer
    from sleuth.training.rollout.in_process import WeightSyncError

    # with a teacher (the policy, shown the answer): its scoring of a step's episodes overlaps the next rollouts
    trainer = Trainer(_cfg(tiny_model_dir, tmp_path / "run", max_steps=3, **{
        "algorithm.distill.teacher": "self", "algorithm.distill.teacher_context": "answer"}), progress=False)
    rows = trainer.train()
    assert [r["policy_version"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["async/staleness_max"] <= 1 and r["async/dropped"] >= 0 and r["grad_norm"] > 0
        assert r["sync/max_logit_diff"] <= 1e-3
        assert r["distill/signal_share"] == 1.0 and r["distill/reverse_kl"] != 0 and r["distill/teacher_s"] > 0
    # trained trajectories carry at most two versions and none older than one behind their step
    import json

    for step in (1, 2, 3):
        lines = (tmp_path / "run" / "rollouts" / f"step-{step:06d}.rank0.jsonl").read_text().splitlines()
        for line in lines:
            versions = {t["policy_version"] for t in json.loads(line)["turns"]}
            assert min(versions) >= step - 2 and max(versions) <= step - 1
    # a weight sync that cannot get the engine within rollout.sync_timeout_s fails clearly
    trainer.cfg.rollout.sync_timeout_s = 0.2
    held, release = threading.Event(), threading.Event()

    def busy():
        with trainer.gate.call():
            held.set()
            release.wait(5)

    t = threading.Thread(target=busy)
    t.start()
    held.wait(5)
    with pytest.raises(WeightSyncError, match="timed out waiting for the rollout engine"):
        trainer._sync()
    release.set()
    t.join(5)
