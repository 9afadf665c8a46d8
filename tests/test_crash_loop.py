"""A Ray worker's restart budget is a window, not a lifetime: deaths further apart than
`cluster.restart_window_s` never add up (a run of days survives a worker killed every hour), and more than
`cluster.max_restarts` deaths within it stop the worker for the run (a crash loop), its work going to the others.
Deaths are real SIGKILLs of `ray::EnvWorker` / `ray::RolloutWorker` processes on a local Ray cluster; the window's
clock is the test's (`Clock`), so that how long a restart takes on a loaded machine cannot move a death across it."""

import os
import signal

import pytest

from sleuth.training.cluster.placement import ClusterConfig, CrashLoop

ray = pytest.importorskip("ray")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_crash_loop_counts_deaths_within_the_window_only():
    clock = Clock()
    loop = CrashLoop(limit=2, window_s=10.0, clock=clock)
    for t in (0.0, 10.0, 20.0, 30.0, 40.0):  # one death every window: never more than one in it
        clock.now = t
        assert not loop.died()
    clock.now = 45.0
    assert not loop.died()  # 40 and 45: two within 10 s, the limit
    clock.now = 49.9
    assert loop.died()  # 40, 45, 49.9: three within 10 s
    assert "died 3 times within 10 s" in loop.verdict("w")
    assert CrashLoop(limit=0, window_s=1.0, clock=clock).died()  # limit 0: the first death stops it


def test_restart_window_is_checked():
    with pytest.raises(ValueError, match="cluster.restart_window_s must be > 0"):
        ClusterConfig(backend="ray", restart_window_s=0)


def _task():
    from sleuth.tasks import load_tasks

    return load_tasks("hotpotqa:test", limit=1)[0]


@pytest.mark.usefixtures("local_ray")
def test_env_actors_survive_spaced_deaths_and_stop_when_crash_looping():
    """Worker 0 is killed twice, a window apart (Ray's lifetime budget of `max_restarts`=1 would have ended it at
    the second), and each time the next episode opens on the restarted worker; killed again at once it is
    crash-looping: its episode fails naming the cause, and new sessions go to worker 1."""
    from sleuth.training.cluster.env_actors import EnvPool, RayEnvError

    clock, window = Clock(), 10.0
    cluster = ClusterConfig(backend="ray", env_actors=2, env_actor_cpus=0.5, max_restarts=1,
                            restart_window_s=window)
    pool = EnvPool(cluster, "DocRead-v0", {"harness": "text"})
    pool.loops = [CrashLoop(1, window, clock=clock) for _ in pool.actors]
    task = _task()
    try:
        env = pool.make()
        assert env.index == 0
        env.reset(options={"task": task})
        for restarts in (1, 2):
            os.kill(pool.pids[0], signal.SIGKILL)
            clock.now += window  # this death and the last are a window apart
            obs, _ = env.reset(options={"task": task})  # a new session on the restarted worker
            assert task.question in obs and pool.restarts == restarts and not pool.stopped
        os.kill(pool.pids[0], signal.SIGKILL)
        with pytest.raises(RayEnvError, match="env worker 0 is crash-looping: it died 2 times within 10 s"):
            env.reset(options={"task": task})
        assert pool.stats() == {"cluster/env_restarts": 3.0, "cluster/live_env_actors": 1.0}
        others = [pool.make() for _ in range(3)]
        assert [e.index for e in others] == [1, 1, 1]
        assert task.question in others[0].reset(options={"task": task})[0]
    finally:
        pool.close()


@pytest.mark.long
@pytest.mark.usefixtures("local_ray")
@pytest.mark.parametrize("transport", ["object_store", "collective"])
def test_rollout_workers_survive_spaced_deaths_and_stop_when_crash_looping(tiny_model_dir, transport):
    """The same for a `RolloutWorker`, which must also come back with the trainer's current weights. Weights changed
    by the trainer reach both workers (verified; `collective`: broadcast over gloo in buckets). Worker 0 is SIGKILLed:
    Ray restarts it from the model on disk, and the next request it gets waits until the current weights are loaded
    (`collective`: from its live peer) and verified: its greedy generation equals an in-process engine holding the new
    weights, not the old ones. Killed again a window later it is recovered again; a third death at once stops it, and
    the router sends its requests to the other worker."""
    import torch

    from sleuth.agents.chat import ChatRenderer
    from sleuth.agents.policies.base import Request, SamplingParams
    from sleuth.agents.policies.hf import TransformersPolicy
    from sleuth.agents.policies.openai_http import ServerUnreachable
    from sleuth.training.cluster.rollout_engine import RayRollout
    from sleuth.training.config import load_config
    from sleuth.training.run import PROBE

    clock, window = Clock(), 15.0
    cfg = load_config(overrides={"cluster.backend": "ray", "cluster.rollout_workers": 2, "cluster.max_restarts": 1,
                                 "cluster.restart_window_s": window, "update.sync_transport": transport,
                                 "update.sync_bucket_mb": 0.05})
    trained = _model(tiny_model_dir)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(torch.randn_like(p) * 0.05, alpha=1.0)
    local = TransformersPolicy(tiny_model_dir, device="cpu", dtype=torch.float32)
    local.model.load_state_dict(trained.state_dict())
    probe = ChatRenderer(local.tokenizer).prompt_ids(PROBE)
    rollout = RayRollout(cfg.rollout, cfg.cluster, cfg.update, tiny_model_dir, torch.float32, probe)
    victim = rollout.pool.handles[0]
    victim.crash_loop = CrashLoop(1, window, clock=clock)
    reqs = [Request(probe, PROBE, None)]
    sampling = SamplingParams(max_tokens=8, temperature=0.0)
    try:
        stats = rollout.sync(trained)
        assert stats["sync/max_logit_diff"] <= 1e-3
        if transport == "collective":  # the tiny model's ~0.4 MB in buckets of 0.05 MB
            assert stats["sync/bytes_per_s"] > 0 and len(rollout.pool.collective.plan) >= 8
        want = local.generate(reqs, sampling)
        old = TransformersPolicy(tiny_model_dir, device="cpu", dtype=torch.float32).generate(reqs, sampling)
        assert old[0].logprobs != pytest.approx(want[0].logprobs, abs=1e-4)  # the model on disk answers otherwise
        for restarts in (1, 2):
            os.kill(victim.pid, signal.SIGKILL)
            clock.now += window  # this death and the last are a window apart
            got = victim.generate(reqs, sampling)
            assert got[0].ids == want[0].ids and got[0].logprobs == pytest.approx(want[0].logprobs, abs=1e-4)
            assert victim.restarts == restarts and rollout.pool.restarts == restarts and not victim.dead
        os.kill(victim.pid, signal.SIGKILL)
        with pytest.raises(ServerUnreachable, match="rollout-worker-0 is crash-looping") as e:
            victim.generate(reqs, sampling)
        assert e.value.permanent and victim.dead
        assert rollout.policy.generate(reqs * 2, sampling)[1].ids == want[0].ids
        assert rollout.sync(trained)["cluster/live_workers"] == 1
    finally:
        rollout.close()


def _model(path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
