"""Information-gain step rewards (CIGPO): hand-computed advantages, the T+1 reader-pass count, and the
real SmolLM2 reader's gold-answer probability rising when the gold paragraph is added."""

import math

import numpy as np
import pytest

from sleuth.agents.trajectory import ReadEvent, Trajectory, Turn
from sleuth.rewards.info_gain import InfoGain, read_documents
from sleuth.tasks.base import Task
from sleuth.tasks.qa import qa_docs


class TableReader:
    """Stands in for the model in the formula test only: a context's gold-answer mean logprob is looked up
    by the documents it holds."""

    def __init__(self, table):
        self.table, self.calls = table, 0

    def prompt(self, question, docs):
        return "|".join(docs)

    def score(self, pairs):
        self.calls += len(pairs)
        return [(self.table[p] * 2, 2) for p, _ in pairs]  # two answer tokens, mean logprob = table value


def turn(read=None, obs="", ids=2):
    return Turn(list(range(ids)), [0.0] * ids, "a", observation=obs, observation_ids=[7] if read else [],
                read=ReadEvent(**read) if read else None)


def traj(task_id, reads, reward):
    turns = [turn({"doc": d, "reread": rr}, obs=f"D{d}") for d, rr in reads] + [turn()]
    return Trajectory(task_id, "DocRead-v0", [1], turns=turns, reward=reward, group=task_id)


TASK = Task("q", "who?", "Ann", payload={"docs": [{"title": f"T{i}", "text": ""} for i in range(4)]})


def test_gold_logprob_gains_and_advantages_by_hand():
    # log π(a|c)/|a|: question only −3; after D0 −1; after D0,D1 −1.5; after D2 −2.5
    reader = TableReader({"": -3.0, "D0": -1.0, "D0|D1": -1.5, "D2": -2.5})
    est = InfoGain("gold_logprob", reader=reader, outcome="dr_grpo", gamma=0.5)
    a = traj("q", [(0, False), (1, False)], reward=1.0)  # gains +2, −0.5
    b = traj("q", [(2, False), (2, True)], reward=0.0)  # gain +0.5, then a re-read: 0
    steps = est.step_rewards([a, b], {"q": TASK})
    assert steps == [[2.0, -0.5, 0.0], [0.5, 0.0, 0.0]]
    # non-final turns of the group: gains 2, −0.5, 0.5, 0 → mean 0.5, population std 0.93541
    mean, std = 0.5, 0.935414
    z = lambda g: (g - mean) / (std + 1e-6)  # noqa: E731
    out = est([a, b], {"q": TASK})
    adv = out.values
    # outcome (dr_grpo): +0.5 / −0.5; returns with γ = 0.5 over turns; the final turn carries no step term
    a_turns = [0.5 + z(2.0) + 0.5 * z(-0.5), 0.5 + z(-0.5), 0.5]
    b_turns = [-0.5 + z(0.5) + 0.5 * z(0.0), -0.5 + z(0.0), -0.5]
    assert z(2.0) == pytest.approx(1.60357, abs=1e-4) and z(0.0) == pytest.approx(-0.53452, abs=1e-4)
    assert adv[0].tolist() == pytest.approx(np.repeat(a_turns, 2).tolist(), abs=1e-5)
    assert adv[1].tolist() == pytest.approx(np.repeat(b_turns, 2).tolist(), abs=1e-5)
    # the step rewards of the read turns come back as the estimator's metrics; the trajectories are untouched
    assert out.metrics == {"step/info_gain/gold_logprob": [2.0, -0.5, 0.5, 0.0]}
    assert all(not t.info for t in a.turns + b.turns)


def test_gold_prob_entropy_and_kl_by_hand():
    reader = TableReader({"": math.log(0.2), "D0": math.log(0.6)})
    t = traj("q", [(0, False)], reward=0.0)
    assert InfoGain("gold_prob", reader=reader).step_rewards([t], {"q": TASK})[0][0] == pytest.approx(0.4)
    # entropy / kl over candidates: every candidate scores the same here → uniform before and after
    flat = TableReader({"": -1.0, "D0": -1.0})
    assert InfoGain("entropy", reader=flat, candidates=3).step_rewards([t], {"q": TASK})[0][0] == pytest.approx(0)
    assert InfoGain("kl", reader=flat, candidates=3).step_rewards([t], {"q": TASK})[0][0] == pytest.approx(0)


def test_failed_and_repeated_reads_are_not_new_documents():
    t = traj("q", [(3, False), (1, False), (1, True)], reward=0.0)
    t.turns[0].error = "tool failed"  # a failed turn adds no document and earns nothing
    assert read_documents(t) == [(1, "D1"), (2, None)]


def test_a_read_the_policy_never_saw_gains_nothing(hotpot_tasks):
    """The budget ends the episode on a read: the agent loop marks it not shown, and its gain is 0 (it was
    once scored as a new, empty document)."""
    import sleuth
    from sleuth.agents.loop.episodes import run_episodes
    from sleuth.agents.policies.load import load_policy

    task = hotpot_tasks[0]
    make = lambda: sleuth.make("DocRead-v0", harness="text", budget=1)  # noqa: E731
    [t] = list(run_episodes(make, [task], load_policy("oracle")))  # two gold reads for a budget of one
    last = t.turns[-1]
    assert t.stop_reason == "budget" and last.read is not None and last.read.shown is False
    assert t.turns[0].read.shown is True
    reader = TableReader({"": -3.0, t.turns[0].observation: -2.0, f"{t.turns[0].observation}|": -1.0})
    steps = InfoGain("gold_logprob", reader=reader).step_rewards([t], {task.id: task})
    assert steps[0][-1] == 0.0 and steps[0][0] == pytest.approx(1.0)


@pytest.fixture(scope="module")
def reader():
    from sleuth.rewards.reader import Reader

    return Reader("smollm2")


def test_reader_passes_are_t_plus_one(reader, hotpot_tasks):
    task = hotpot_tasks[0]
    docs = qa_docs(task).docs
    turns = [turn({"doc": i, "reread": False}, obs=f"[{i}] {docs[i].title}\n{docs[i].text}") for i in (0, 1, 2)]
    t = Trajectory(task.id, "DocRead-v0", [1], turns=turns + [turn()], reward=0.0, group=task.id)
    before = reader.calls
    InfoGain("gold_prob", reader=reader).step_rewards([t], {task.id: task})
    assert reader.calls - before == 4  # T = 3 reads → 4 contexts, not 2T = 6


def test_gold_paragraph_raises_gold_prob_for_smollm2(reader, hotpot_tasks):
    """HotpotQA test question 1 (kept fixed): adding a gold supporting paragraph raises SmolLM2's
    length-normalised probability of the gold answer; adding a distractor raises it less."""
    task = hotpot_tasks[1]
    view = qa_docs(task)
    docs, gold = view.docs, view.gold()[0]
    other = next(i for i in range(len(docs)) if i not in view.gold())

    def gain(i):
        t = Trajectory(task.id, "DocRead-v0", [1], turns=[turn({"doc": i, "reread": False},
                                                                obs=f"[{i}] {docs[i].title}\n{docs[i].text}")])
        return InfoGain("gold_prob", reader=reader).step_rewards([t], {task.id: task})[0][0]

    g_gold, g_other = gain(gold), gain(other)
    assert g_gold > 0 and g_gold > g_other


def test_support_variant_gains_the_share_of_gold_documents_and_loads_no_reader():
    task = Task("q", "who?", "Ann", payload={"docs": [{"title": f"T{i}", "text": ""} for i in range(4)],
                                             "supporting": ["T1", "T3"]})

    def reads(*docs):  # (doc, reread) pairs → a trajectory whose reads carry their titles
        turns = [turn({"doc": d, "title": f"T{d}", "reread": rr}, obs=f"D{d}") for d, rr in docs] + [turn()]
        return Trajectory("q", "DocRead-v0", [1], turns=turns, reward=0.0, group="q")

    est = InfoGain("support", reader="no-such-model")  # the reader is never loaded
    assert est.reader is None and not est.refresh_due(1)
    a, b = reads((1, False), (1, True), (0, False)), reads((3, False), (1, False))
    assert est.step_rewards([a, b], {"q": task}) == [[0.5, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0]]
    # pool of non-final turns: 0.5, 0, 0, 0.5, 0.5 → mean 0.3, population std 0.244949; outcome: all zero
    z = lambda g: (g - 0.3) / (0.244949 + 1e-6)  # noqa: E731
    adv = est([a, b], {"q": task}).values
    assert adv[1].tolist() == pytest.approx(np.repeat([z(0.5) + z(0.5), z(0.5), 0.0], 2).tolist(), abs=1e-4)
    with pytest.raises(ValueError, match="supporting titles"):
        est.step_rewards([a], {"q": TASK})


def test_turn_index_baseline_compares_returns_to_go_at_the_same_turn_by_hand():
    task = Task("q", "who?", "Ann", payload={"docs": [{"title": f"T{i}", "text": ""} for i in range(4)],
                                             "supporting": ["T1", "T3"]})

    def reads(*docs):
        turns = [turn({"doc": d, "title": f"T{d}", "reread": rr}, obs=f"D{d}") for d, rr in docs] + [turn()]
        return Trajectory("q", "DocRead-v0", [1], turns=turns, reward=0.0, group="q")

    a, b = reads((1, False), (1, True), (0, False)), reads((3, False), (1, False))
    est = InfoGain("support", step_baseline="turn_index")
    # gains a (0.5, 0, 0, 0), b (0.5, 0.5, 0); returns-to-go (γ = 1) a (0.5, 0, 0, 0), b (1.0, 0.5, 0)
    # turn 0: pool (0.5, 1.0) → ∓1; turn 1: (0, 0.5) → ∓1; turn 2: (0, 0) → 0; turn 3: a alone → 0
    adv = est([a, b], {"q": task}).values
    assert adv[0].tolist() == pytest.approx(np.repeat([-1.0, -1.0, 0.0, 0.0], 2).tolist(), abs=1e-5)
    assert adv[1].tolist() == pytest.approx(np.repeat([1.0, 1.0, 0.0], 2).tolist(), abs=1e-5)
    pooled = InfoGain("support")([a, b], {"q": task}).values  # the default baseline ranks them alike here
    assert pooled[0][0] < pooled[1][0]
    with pytest.raises(ValueError, match="step_baseline"):
        InfoGain("support", step_baseline="per_turn")


def test_answer_variant_pays_the_first_read_that_shows_the_answer_by_hand():
    def reads(*docs):  # (doc, reread, holds the answer) → a trajectory of reads, then the answer
        turns = [turn({"doc": d, "reread": rr, "answer": held}, obs=f"D{d}") for d, rr, held in docs] + [turn()]
        return Trajectory("q", "DocRead-v0", [1], turns=turns, reward=0.0, group="q")

    est = InfoGain("answer", reader="no-such-model", step_baseline="turn_index")  # no reader is loaded
    assert est.reader is None
    # a: a first hop without the answer, then the answer's document, then it again (a re-read gains nothing);
    # b: the answer's document at once, then another that also holds it (only the first one pays)
    a, b = reads((0, False, False), (2, False, True), (2, True, True)), reads((2, False, True), (3, False, True))
    assert est.step_rewards([a, b], {"q": TASK}) == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
    # returns-to-go a (1, 1, 0, 0), b (1, 0, 0): turn 0 ties (0), turn 1 (1 vs 0) → ±1, turns 2-3 → 0
    adv = est([a, b], {"q": TASK}).values
    assert adv[0].tolist() == pytest.approx(np.repeat([0.0, 1.0, 0.0, 0.0], 2).tolist(), abs=1e-5)
    assert adv[1].tolist() == pytest.approx(np.repeat([0.0, -1.0, 0.0], 2).tolist(), abs=1e-5)
    yes = Task("y", "is it?", "yes", payload=TASK.payload)
    assert est.step_rewards([reads((2, False, None))], {"q": yes}) == [[0.0, 0.0]]  # yes / no: outcome only
    with pytest.raises(ValueError, match="ReadEvent.answer"):  # an env that does not say: refused, not zero
        est.step_rewards([reads((2, False, None))], {"q": TASK})


def test_answer_variant_scores_real_docread_episodes_read_back_from_disk(tmp_path):
    """The env marks each read (`ReadEvent.answer`), the flag survives the trajectories file, and the gain
    lands on the oracle's read of the document that holds the answer."""
    from sleuth.agents.eval.episodes import load_trajectories
    from sleuth.cli.main import main
    from sleuth.tasks.holdout import load_held_out

    assert main(["eval", "--tasks", "hotpotqa:test", "--policy", "oracle", "--limit", "6", "--out", str(tmp_path)]) == 0
    trajs = load_trajectories(tmp_path / "trajectories.jsonl")
    tasks = {t.id: t for t in load_held_out(["hotpotqa:test"])}
    rewards = InfoGain("answer").step_rewards(trajs, tasks)
    for traj, r in zip(trajs, rewards, strict=True):
        flags = [turn.read.answer for turn in traj.turns if turn.read]
        first = next((i for i, turn in enumerate(traj.turns) if turn.read and turn.read.answer), None)
        assert r == [1.0 if i == first else 0.0 for i in range(len(traj.turns))], (traj.task_id, flags)
    assert sum(map(sum, rewards)) >= 3  # most oracle episodes read the answer's document
