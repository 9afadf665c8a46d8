"""The continuous agent loop: one trajectory per task under random env latencies and failures, requests
that do not wait for other episodes' env steps, the request queue's batching, per-turn policy versions."""

import random
import threading
import time

import gymnasium
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sleuth
from sleuth.agents.loop.episodes import run_episodes
from sleuth.agents.policies.base import Generation, Request, SamplingParams
from sleuth.agents.policies.load import load_policy
from sleuth.agents.policies.requests import RequestQueue


class Flaky(gymnasium.Wrapper):
    """DocRead with a random latency per step and a chance of failing at reset or at a step."""

    def __init__(self, rng: random.Random, p_fail: float, max_latency: float):
        super().__init__(sleuth.make("DocRead-v0", harness="text"))
        self.rng, self.p_fail, self.max_latency = rng, p_fail, max_latency

    def reset(self, **kw):
        if self.rng.random() < self.p_fail:
            raise ValueError("reset went wrong")
        return self.env.reset(**kw)

    def step(self, action):
        time.sleep(self.rng.random() * self.max_latency)
        if self.rng.random() < self.p_fail:
            raise ConnectionError("env server unreachable")
        return self.env.step(action)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6), n=st.integers(1, 9), concurrency=st.integers(1, 5),
       workers=st.sampled_from([0, 3]), lockstep=st.booleans(), p_fail=st.sampled_from([0.0, 0.2, 0.5]))
def test_one_trajectory_per_task_under_random_latency_and_failures(hotpot_tasks, seed, n, concurrency, workers,
                                                                     lockstep, p_fail):
    rng = random.Random(seed)
    tasks = [hotpot_tasks[i % len(hotpot_tasks)] for i in range(n)]
    trajs = list(run_episodes(lambda: Flaky(rng, p_fail, 0.004), tasks, load_policy("oracle"),
                              concurrency=concurrency, env_threads=workers, lockstep=lockstep))
    assert sorted(t.task_id for t in trajs) == sorted(t.id for t in tasks)  # none lost, none twice
    for t in trajs:
        if t.stop_reason == "reset_error":
            assert t.failed and "reset went wrong" in t.error and not t.turns
        elif t.stop_reason == "env_error":
            assert t.failed and t.truncated and "unreachable" in t.error and t.turns[-1].error == t.error
        else:  # an episode its env let finish is the oracle's: every gold document read, the right answer
            assert t.stop_reason == "final" and t.reward == 1.0
            assert len(t.token_ids()) == len(t.loss_mask()) == len(t.sampling_logprobs())


def test_continuous_and_lockstep_record_the_same_token_exact_trajectories(hotpot_tasks):
    make = lambda: sleuth.make("DocRead-v0", harness="text")  # noqa: E731
    runs = [{t.task_id: t for t in run_episodes(make, hotpot_tasks[:5], load_policy("oracle"), concurrency=3,
                                                  env_threads=w, lockstep=ls)} for w, ls in ((0, True), (2, False))]
    assert runs[0].keys() == runs[1].keys()
    for k, t in runs[0].items():
        assert t.token_ids() == runs[1][k].token_ids() and t.loss_mask() == runs[1][k].loss_mask()


class Recorder:
    """The oracle, logging which (task, turn) each generate call served; its version goes up per call."""

    parallel_calls, max_context = 1, None

    def __init__(self):
        self.inner = load_policy("oracle")
        self.name, self.tokenizer, self.version, self.calls = "recorder", self.inner.tokenizer, 0, []

    def generate(self, requests, sampling):
        self.calls.append([(r.task.id, r.turn) for r in requests])
        gens = self.inner.generate(requests, sampling)
        self.version += 1
        return gens


class SlowFor(gymnasium.Wrapper):
    """DocRead whose steps take `seconds` for one task and no time for the others."""

    def __init__(self, slow_id: str, seconds: float):
        super().__init__(sleuth.make("DocRead-v0", harness="text"))
        self.slow_id, self.seconds = slow_id, seconds

    def step(self, action):
        if self.env.unwrapped.task.id == self.slow_id:
            time.sleep(self.seconds)
        return self.env.step(action)


@pytest.mark.parametrize("lockstep", [False, True])
def test_an_episode_does_not_wait_for_another_episodes_env_step(hotpot_tasks, lockstep):
    slow, fast = hotpot_tasks[0], hotpot_tasks[1]
    policy = Recorder()
    trajs = {t.task_id: t for t in run_episodes(lambda: SlowFor(slow.id, 0.4), [slow, fast], policy,
                                                 concurrency=2, env_threads=2, lockstep=lockstep)}
    assert trajs[slow.id].reward == trajs[fast.id].reward == 1.0
    turns = len(trajs[fast.id].turns)
    assert turns >= 3  # the oracle reads two gold documents, then answers
    served = [req for call in policy.calls for req in call]
    first_slow_reply = served.index((slow.id, 1))
    fast_before = sum(1 for task, _ in served[:first_slow_reply] if task == fast.id)
    if lockstep:  # every round waits for the slow step: both episodes go together, turn by turn
        assert fast_before == 1 and policy.calls[:2] == [[(slow.id, 0), (fast.id, 0)], [(slow.id, 1), (fast.id, 1)]]
    else:  # the fast episode ran to its end while the slow step slept
        assert fast_before == turns
    # every turn records the version of the call that produced it
    for t in trajs.values():
        versions = [turn.policy_version for turn in t.turns]
        assert versions == sorted(versions) and len(set(versions)) == len(versions)


class Gate:
    """A policy whose calls block until released, to see how queued requests are grouped into calls."""

    max_context, name, version, tokenizer = None, "gate", 0, None

    def __init__(self, parallel_calls, fail=False, short=False):
        self.parallel_calls, self.fail, self.short = parallel_calls, fail, short
        self.release, self.calls = threading.Event(), []

    def generate(self, requests, sampling):
        self.calls.append([r.turn for r in requests])
        self.release.wait(5)
        if self.fail:
            raise RuntimeError("engine died")
        gens = [Generation([r.turn], [0.0], str(r.turn)) for r in requests]
        return gens[:-1] if self.short else gens


def req(turn):
    return Request([1], [], None, turn)


def test_one_engine_batches_what_queued_while_it_was_busy():
    gate = Gate(parallel_calls=1)
    q = RequestQueue(gate, SamplingParams())
    first = q.submit([req(0)])
    time.sleep(0.05)
    later = q.submit([req(1), req(2)]) + q.submit([req(3)])
    gate.release.set()
    assert [f.result(5).generation.text for f in first + later] == ["0", "1", "2", "3"]
    assert gate.calls == [[0], [1, 2, 3]]  # what waited went as one call
    q.close()


def test_a_server_gets_each_request_as_its_own_call():
    gate = Gate(parallel_calls=4)
    gate.release.set()
    q = RequestQueue(gate, SamplingParams())
    futures = q.submit([req(i) for i in range(4)])
    assert sorted(f.result(5).generation.ids[0] for f in futures) == [0, 1, 2, 3]
    assert sorted(map(len, gate.calls)) == [1, 1, 1, 1]
    q.close()


@pytest.mark.parametrize("gate, message", [(Gate(1, fail=True), "engine died"),
                                           (Gate(1, short=True), "1 generations for 2")])
def test_a_failed_call_fails_each_of_its_requests(gate, message):
    gate.release.set()
    q = RequestQueue(gate, SamplingParams())
    for f in q.submit([req(0), req(1)]):
        with pytest.raises(RuntimeError, match=message):
            f.result(5)
    q.close()


def test_a_failed_generation_fails_its_episodes_and_the_loop_goes_on(hotpot_tasks):
    gate = Gate(1, fail=True)
    gate.release.set()
    gate.tokenizer = load_policy("oracle").tokenizer
    trajs = list(run_episodes(lambda: sleuth.make("DocRead-v0"), hotpot_tasks[:3], gate, concurrency=2))
    assert sorted(t.task_id for t in trajs) == sorted(t.id for t in hotpot_tasks[:3])
    assert all(t.failed and t.stop_reason == "engine_error" and "engine died" in t.error for t in trajs)
    assert all(t.verdict is None and not t.turns for t in trajs)


def test_sampled_trajectories_do_not_depend_on_the_loop_when_envs_step_inline(hotpot_tasks, tiny_model_dir):
    """With in-process envs the continuous loop forms lock-step's batches, so a seeded run samples the same ids."""
    from sleuth.agents.policies.hf import TransformersPolicy

    make = lambda: sleuth.make("DocRead-v0", harness="text", budget=2)  # noqa: E731
    sampling = SamplingParams(max_tokens=6, temperature=1.0, seed=3)
    runs = []
    for lockstep in (True, False):
        policy = TransformersPolicy(tiny_model_dir)
        runs.append({t.task_id: [turn.action_ids for turn in t.turns]
                     for t in run_episodes(make, hotpot_tasks[:4], policy, sampling, concurrency=3, lockstep=lockstep)})
    assert runs[0] == runs[1] and any(runs[0].values())
