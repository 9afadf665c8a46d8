"""Advantage estimators against hand-computed numbers."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sleuth import rewards
from sleuth.agents.trajectory import ReadEvent, Trajectory, Turn
from sleuth.rewards.group import group_advantages


def traj(task: str, reward: float, tokens=(2, 3)) -> Trajectory:
    turns = [Turn(list(range(n)), [0.0] * n, "x", observation_ids=[9]) for n in tokens]
    return Trajectory(task, "env", [1, 2], turns=turns, reward=reward, group=task)


def test_grpo_by_hand():
    # rewards 1, 0, 0, 1 → mean 0.5, sample std √(4·0.25/3) = 0.57735 → ±0.86603
    trajs = [traj("a", r) for r in (1, 0, 0, 1)] + [traj("b", r) for r in (0.2, 0.8)]
    adv = rewards.make("grpo")(trajs, {}).values
    assert [a[0] for a in adv[:4]] == pytest.approx([0.86603, -0.86603, -0.86603, 0.86603], abs=1e-4)
    # 0.2, 0.8 → mean 0.5, sample std 0.42426 → ∓0.70711 = ∓(G−1)/√G, the bound reached
    assert [a[0] for a in adv[4:]] == pytest.approx([-0.70711, 0.70711], abs=1e-4)
    assert all(len(a) == 5 and np.all(a == a[0]) for a in adv)  # broadcast over both turns' tokens


def test_dr_grpo_and_rloo_by_hand():
    trajs = [traj("a", r) for r in (1.0, 0.0, 0.0)]
    dr = [a[0] for a in rewards.make("dr_grpo")(trajs, {}).values]
    assert dr == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    rloo = [a[0] for a in rewards.make("rloo")(trajs, {}).values]
    # r_i − mean of the others: 1 − 0, 0 − 0.5, 0 − 0.5
    assert rloo == pytest.approx([1.0, -0.5, -0.5])


def test_zero_variance_group_gets_zero_advantage():
    adv = rewards.make("grpo")([traj("a", 0.3)] * 4, {}).values
    assert all(np.all(a == 0) for a in adv)


@given(st.lists(st.floats(0, 1), min_size=2, max_size=16))
def test_grpo_bound(rewards):
    g = len(rewards)
    a = group_advantages(np.array(rewards), "grpo", eps=0.0) if np.std(rewards) > 0 else np.zeros(g)
    assert np.all(np.abs(a) <= (g - 1) / math.sqrt(g) + 1e-9)


def test_unknown_estimator_and_arguments_are_refused():
    with pytest.raises(ValueError, match="did you mean .grpo.*known: .*grpo"):
        rewards.make("grpo2")
    with pytest.raises(ValueError, match="bad arguments"):
        rewards.make("dr_grpo", eps=1)
    assert {"grpo", "dr_grpo", "rloo"} <= set(rewards.names())


def _obs_traj(task, observations, reward):
    turns = [Turn([1, 2], [0.0, 0.0], "a", observation=o, observation_ids=[9] if o else []) for o in observations]
    return Trajectory(task, "env", [1], turns=turns, reward=reward, group=task)


def test_gigpo_by_hand():
    from sleuth.rewards.gigpo import GiGPO

    # three trajectories of one task: a reads A then answers (R=1), b reads A then answers (R=0), c reads B (R=0)
    a = _obs_traj("t", ["A", ""], 1.0)
    b = _obs_traj("t", ["A", ""], 0.0)
    c = _obs_traj("t", ["B", ""], 0.0)
    adv = GiGPO(omega=0.5, gamma=0.5, eps=0.0)([a, b, c], {}).values
    # episode: grpo of (1, 0, 0): mean 1/3, sample std 0.57735 → 1.1547, −0.57735, −0.57735
    ep = [1.1547, -0.57735, -0.57735]
    # step returns (γ = 0.5, outcome on the last turn): turn 0 → (0.5, 0, 0), turn 1 → (1, 0, 0)
    # both levels use the sample (n−1) std, as verl-agent does:
    # anchor () holds every turn 0: (0.5, 0, 0) → mean 1/6, sample std 0.28868 → z (1.1547, −0.57735, −0.57735)
    # anchor ("A",) holds a's and b's turn 1: (1, 0) → sample std 0.70711 → (0.70711, −0.70711); c's turn 1
    # (anchor ("B",)) is alone → 0
    expect = [[ep[0] + 0.5 * 1.1547, ep[0] + 0.5 * 0.70711], [ep[1] - 0.5 * 0.57735, ep[1] - 0.5 * 0.70711],
              [ep[2] - 0.5 * 0.57735, ep[2]]]
    for got, want in zip(adv, expect, strict=True):
        assert got.tolist() == pytest.approx(np.repeat(want, 2).tolist(), abs=1e-4)


def _qa_task():
    from sleuth.tasks.base import Task

    return Task("q", "who?", "Ann", payload={"supporting": ["Gold"], "docs": []})


def _read_traj(reads, reward):
    """reads: (doc, title, observation) per read round, then a final answer round."""
    turns = [Turn([1, 2], [0.0, 0.0], f"read {d}", observation=obs, observation_ids=[9],
                  read=ReadEvent(d, title)) for d, title, obs in reads]
    turns.append(Turn([1, 2], [0.0, 0.0], "answer: x"))
    return Trajectory("q", "DocRead-v0", [1], turns=turns, reward=reward, group="q")


def test_cw_grpo_temperature_sharpens_as_gamma_grows():
    from sleuth.rewards.contribution import normalise

    # softmax(γ·c): γ = 5, c = (1, 0, 0) → (1, e^−5, e^−5) / (1 + 2e^−5)
    z = 1 + 2 * math.exp(-5)
    assert normalise([1, 0, 0], 5.0).tolist() == pytest.approx([1 / z, math.exp(-5) / z, math.exp(-5) / z])
    assert normalise([1, 0, 0], 5.0)[0] == pytest.approx(0.99, abs=0.005)
    sharp = [normalise([1, 0, 0], g)[0] for g in (0.5, 1.0, 2.0, 5.0, 9.9, 10.0)]
    assert sharp == sorted(sharp) and sharp[-1] == 1.0  # monotone up to the hard limit at γ = 10
    assert normalise([0, 0], 10.0).tolist() == [0.0, 0.0]  # Σc = 0 at γ ≥ 10: the authors' clamp, weight 0
    assert normalise([0, 0], 12.0).tolist() == [0.0, 0.0]
    assert normalise([0, 0], 5.0).tolist() == [0.5, 0.5]  # the softmax of equal contributions stays uniform


@pytest.mark.parametrize("gamma, weights", [(10.0, [1.0, 0.0]), (1.0, [math.e / (math.e + 1), 1 / (math.e + 1)]),
                                            (5.0, [1 / (1 + math.exp(-5)), math.exp(-5) / (1 + math.exp(-5))])])
def test_cw_grpo_by_hand(gamma, weights):
    from sleuth.rewards.contribution import CWGRPO

    a = _read_traj([(0, "Gold", "Ann was born..."), (1, "Other", "nothing")], 1.0)  # c = (1·1, 0·0)
    b = _read_traj([(1, "Other", "nothing"), (0, "Gold", "Ann was born...")], 0.0)
    c = _read_traj([(2, "Other2", "x"), (3, "Other3", "y")], 0.0)
    est = CWGRPO(gamma=gamma)
    adv = est([a, b, c], {"q": _qa_task()}).values
    A = 1.1547  # grpo of (1, 0, 0)
    want = [A * 2 * weights[0], A * 2 * weights[1], A]
    assert adv[0].tolist() == pytest.approx(np.repeat(want, 2).tolist(), abs=1e-4)
    assert np.mean([adv[0][0], adv[0][2]]) == pytest.approx(A, abs=1e-4)  # mean over non-final rounds is A
    for neg in adv[1:]:  # A ≤ 0: untouched
        assert neg.tolist() == pytest.approx([-0.57735] * 6, abs=1e-4)
    assert est.judged == 1  # the judge ran only on the positive trajectory


def test_cw_grpo_without_any_contribution():
    """No round contributed: at γ ≥ 10 (the default) the non-final rounds get weight 0 and only the final
    round keeps the GRPO advantage, as the authors' code does (Σc clamped at 1e-6); below 10 the softmax of
    equal contributions is uniform, which keeps A on every round."""
    from sleuth.rewards.contribution import CWGRPO

    a = _read_traj([(2, "Other2", "x")], 1.0)
    b = _read_traj([(3, "Other3", "y")], 0.0)
    adv = CWGRPO()([a, b], {"q": _qa_task()}).values
    assert adv[0].tolist() == pytest.approx([0.0, 0.0, 0.70711, 0.70711], abs=1e-4)
    assert adv[1].tolist() == pytest.approx([-0.70711] * 4, abs=1e-4)  # A ≤ 0: untouched
    soft = CWGRPO(gamma=5.0)([a, b], {"q": _qa_task()}).values
    assert soft[0].tolist() == pytest.approx([0.70711] * 4, abs=1e-4)


def test_cw_grpo_adv_by_hand():
    """A group whose reads differ: φ is normalised within the group, amplifies the success that read well
    and softens the penalty of the failure that still read something useful."""
    from sleuth.rewards.contribution import CWGRPOAdv
    from sleuth.rewards.info_gain import InfoGain

    a = _read_traj([(0, "Gold", "A"), (1, "Other", "B")], 1.0)  # success
    b = _read_traj([(2, "Gold2", "C")], 0.0)  # failure that read a useful document
    c = _read_traj([(3, "Other3", "D")], 0.0)  # failure that read nothing useful
    steps = [[0.9, 0.1, 0.0], [0.6, 0.0], [0.0, 0.0]]  # read-turn gains 0.9, 0.1, 0.6, 0 → baseline 0.4

    class Fixed(InfoGain):
        def __init__(self):
            self.variant = "gold_prob"

        def step_rewards(self, trajs, tasks):
            return steps

    est = CWGRPOAdv(phi_clip=(0.5, 2.0))
    est.step_source = Fixed()
    # raw φ: a: s = (0.5, −0.3) → ½ · 0.5 = 0.25; b: s = (0.2) → 1 · 0.2 = 0.2; c: s = (−0.4) → 0
    phi = est.contributions([a, b, c], steps)
    assert phi.tolist() == pytest.approx([0.25, 0.2, 0.0])
    # group mean 0.15 → φ̃ = (1.6667, 1.3333, 0), clipped to [0.5, 2] → (1.6667, 1.3333, 0.5)
    assert est.weights([a, b, c], phi).tolist() == pytest.approx([5 / 3, 4 / 3, 0.5])
    out = est([a, b, c], {"q": _qa_task()})
    # c_i = R − mean = (2/3, −1/3, −1/3): success ×φ̃, failures ÷φ̃
    want = [2 / 3 * 5 / 3, -1 / 3 / (4 / 3), -1 / 3 / 0.5]
    assert [v[0] for v in out.values] == pytest.approx(want)
    assert out.metrics["cw_grpo_adv/phi"] == pytest.approx([5 / 3, 4 / 3, 0.5])
    # the same group without any contribution: φ̃ = 1, plain Dr.GRPO
    steps[:] = [[0.0, 0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]
    assert [v[0] for v in est([a, b, c], {"q": _qa_task()}).values] == pytest.approx([2 / 3, -1 / 3, -1 / 3])


def test_llm_judge_parses_and_runs_with_smollm2():
    from sleuth.rewards.contribution import LLMJudge, _parse_judgement

    assert _parse_judgement("useful: yes\nsupported: no") == (1.0, 0.0)
    assert _parse_judgement("**Useful**: Yes. Supported: yes") == (1.0, 1.0)
    assert _parse_judgement("I cannot tell") == (0.0, 0.0)
    scores = LLMJudge("smollm2", max_tokens=12)(_read_traj([(0, "Gold", "Ann was born in Oslo.")], 1.0), _qa_task())
    assert len(scores) == 1 and all(x in (0.0, 1.0) for x in scores[0])


def test_refresh_and_policy_checks_reach_a_nested_step_reward():
    from sleuth.rewards.info_gain import InfoGain

    class Reader:  # what InfoGain needs of a reader for refresh and the policy check
        def __init__(self):
            self.tokenizer = type("Tok", (), {"get_vocab": lambda self: {"a": 0}})()
            self.loaded, self.cleared = None, 0
            self.model = type("M", (), {"load_state_dict": lambda m, state, strict: setattr(self, "loaded", state)})()

        def clear_cache(self):
            self.cleared += 1

    for name, args in (("gigpo", {}), ("cw_grpo_adv", {}), ("gear_mix", {"granularities": ["outcome", "info_gain"]})):
        est = rewards.make(name, **args, step_reward={"variant": "gold_prob", "reader": Reader(), "refresh_every": 2})
        assert isinstance(est.step_source, InfoGain)
        assert [est.refresh_due(s) for s in (1, 2, 3, 4)] == [False, True, False, True], name
        est.refresh({"w": 1})
        assert est.step_source.reader.loaded == {"w": 1} and est.step_source.reader.cleared == 1
        with pytest.raises(ValueError, match="tokenizer is not the policy's"):
            est.check_policy(type("Other", (), {"get_vocab": lambda self: {"b": 0}})())
    assert not rewards.make("grpo").refresh_due(1)


def test_a_factory_that_builds_no_estimator_is_refused():
    from sleuth.rewards import ESTIMATORS, register

    @register("_not_an_estimator")
    def bad():
        return lambda trajs: []

    try:
        with pytest.raises(TypeError, match="not a sleuth.rewards.Estimator"):
            rewards.make("_not_an_estimator")
    finally:
        ESTIMATORS.unregister("_not_an_estimator")
