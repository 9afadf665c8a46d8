"""LLM judges as verifiers, against a scripted judge served for real (FastAPI on a loopback port, the `openai`
SDK as the client): what the judge is shown and how its reply is read, a group's ranks mapped to GRPO
advantages by hand, the cache, weights beside a rule, and every fault (junk, HTTP errors, a hang, a judge that
is down) ending as a failed episode, never as a score."""

import json
import re

import numpy as np
import pytest
from judge_server import Hang, judge_file, members_shown

from sleuth import rewards
from sleuth.agents.eval.rescore import Rescorer
from sleuth.agents.trajectory import Trajectory, Turn
from sleuth.core.net import free_port
from sleuth.tasks.base import Task
from sleuth.verifiers.base import CannotScore, Verdict
from sleuth.verifiers.judge import JudgeConfigError, JudgeUnavailable
from sleuth.verifiers.registry import get_verifier, group_verifier, verdict

TASK = Task("q1", "Which city is the capital of France?", "Paris")


def score_by_digit(messages) -> str:
    """A judge that gives each member the digit written in it: its scores follow the content, not the place."""
    digits = [re.search(r"(\d)", r).group(1) for r in members_shown(messages)]
    lines = [f"RESPONSE {i + 1} SCORE: {d}" for i, d in enumerate(digits)]
    return "They differ.\n" + "\n".join(lines)


def episode(response: str, group: str = "g", reward: float = 0.0) -> Trajectory:
    """A finished one-turn episode whose env scored `response` with `reward`."""
    turn = Turn([5, 6], [-0.1, -0.2], f"answer: {response}", reward=reward)
    return Trajectory(TASK.id, "DocRead-v0", [1, 2, 3], turns=[turn], reward=reward, terminated=True,
                      verdict=Verdict(reward, {"f1": reward}, response=response), group=group, stop_reason="final")


def test_pointwise_judge_is_shown_the_task_and_its_reply_is_read_and_recorded(serve_judge, tmp_path):
    judge, url = serve_judge(lambda m: "The answer matches the reference.\nSCORE: 8")
    name = judge_file(tmp_path, url, rubric="Is it right?")
    v = verdict(name, TASK, "It is Paris.")
    assert v.score == pytest.approx(0.8) and v.response == "It is Paris."
    prompt = judge.requests[0][-1]["content"]
    assert "Is it right?" in prompt and TASK.question in prompt and "Reference answer: Paris" in prompt
    assert "It is Paris." in prompt
    said = v.details["judge"]
    assert said["reply"].endswith("SCORE: 8") and said["prompt"] == prompt and said["model"] == "scripted"
    assert said["prompt_tokens"] > 0 and said["cached"] is False
    # a scale of its own and a pattern of its own; the last score in the reply counts
    _, url2 = serve_judge(lambda m: "grade=2 ... on reflection grade=3")
    v = verdict(judge_file(tmp_path, url2, scale=4, score_pattern=r"grade=(\d)"), {"question": "q", "answer": "a"}, "x")
    assert v.score == pytest.approx(0.75)
    # labels: a verdict word instead of a number (what small judges follow); a reply with none of them is junk
    judge4, url4 = serve_judge(lambda m: "No, it names another city." if "Lyon" in m[-1]["content"] else "Yes.")
    yes_no = judge_file(tmp_path, url4, labels={"yes": 1, "no": 0}, retries=0)
    assert verdict(yes_no, TASK, "Paris").score == 1.0 and verdict(yes_no, TASK, "Lyon").score == 0.0
    assert "Answer with one word: yes or no." in judge4.requests[0][-1]["content"]
    _, url5 = serve_judge(lambda m: "Maybe.")
    with pytest.raises(JudgeUnavailable, match="none of yes, no"):
        verdict(judge_file(tmp_path, url5, labels={"yes": 1, "no": 0}, retries=0), TASK, "Paris")
    # reference: false keeps the gold answer out of the prompt
    judge3, url3 = serve_judge(lambda m: "SCORE: 10")
    verdict(judge_file(tmp_path, url3, reference=False), TASK, "Paris")
    assert "Paris" not in judge3.requests[0][-1]["content"].replace("Response:\n<<<\nParis", "")


@pytest.mark.parametrize("group_reward, want", [("rank", [1.0, 1 / 6, 2 / 3, 1 / 6]), ("score", [0.9, 0.3, 0.6, 0.3])])
def test_a_group_judge_maps_one_comparison_to_grpo_advantages_as_documented(serve_judge, tmp_path, group_reward, want):
    judge, url = serve_judge(score_by_digit)
    # seed 2 shows them as members 4, 1, 3, 2 (seed 0 happens to keep this group's order)
    name = judge_file(tmp_path, url, mode="group", group_reward=group_reward, seed=2)
    group = [episode(r) for r in ("answer 9", "answer 3", "answer 6", "also 3")]
    got = Rescorer(name, {TASK.id: TASK})(group)
    assert len(judge.requests) == 1  # the whole group in one call
    shown = members_shown(judge.requests[0])
    assert sorted(shown) == sorted(t.verdict.response for t in group) and shown != [t.verdict.response for t in group]
    assert [t.reward for t in got] == pytest.approx(want)
    assert [t.turns[-1].reward for t in got] == pytest.approx(want) and [t.verdict.score for t in got] == \
        pytest.approx(want)
    said = [t.verdict.details["judge"] for t in got]
    assert [s["rank"] for s in said] == [1, 3.5, 2, 3.5] and sorted(s["shown_as"] for s in said) == [1, 2, 3, 4]
    assert [shown[s["shown_as"] - 1] for s in said] == [t.verdict.response for t in group]  # unshuffled right
    # GRPO by hand: A_i = (r_i − mean) / (sample std + eps)
    r = np.array(want)
    hand = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
    adv = rewards.make("grpo")(got, {TASK.id: TASK}).values
    assert [float(a[0]) for a in adv] == pytest.approx(list(hand), abs=1e-6)
    if group_reward == "rank":
        assert list(hand) == pytest.approx([1.224745, -0.816497, 0.408248, -0.816497], abs=1e-5)


def test_rescoring_keeps_groups_apart_and_leaves_unanswered_episodes(serve_judge, tmp_path):
    judge, url = serve_judge(score_by_digit)
    name = judge_file(tmp_path, url, mode="group", group_reward="score")
    no_answer = Trajectory(TASK.id, "DocRead-v0", [1], turns=[Turn([5], [-0.1], "read 3")], truncated=True, group="a")
    trajs = [episode("x 2", "a"), no_answer, episode("x 7", "a"), episode("y 4", "b"), episode("y 1", "b")]
    got = Rescorer(name, {TASK.id: TASK})(trajs)
    assert len(judge.requests) == 2 and [len(members_shown(m)) for m in judge.requests] == [2, 2]
    assert [t.reward for t in got] == pytest.approx([0.2, 0.0, 0.7, 0.4, 0.1]) and got[1] is no_answer
    assert [t.group for t in got] == [t.group for t in trajs]


def test_a_rescore_is_answered_from_the_cache(serve_judge, tmp_path):
    judge, url = serve_judge(lambda m: "SCORE: 6")
    cache = tmp_path / "judge-cache.jsonl"
    name = judge_file(tmp_path, url, cache=str(cache))
    rescorer = Rescorer(name, {TASK.id: TASK})
    first = rescorer([episode("Paris"), episode("Lyon")])
    assert len(judge.requests) == 2 and rescorer.take_stats().calls == 2
    again = rescorer([episode("Paris"), episode("Lyon")])
    stats = rescorer.take_stats()
    assert len(judge.requests) == 2 and stats.cache_hits == 2 and stats.calls == 0
    assert [t.reward for t in again] == [t.reward for t in first] and again[0].verdict.details["judge"]["cached"]
    # another process with the same cache file (a resumed run) asks nothing either; a torn last line is skipped
    with cache.open("a") as f:
        f.write('{"key": "abc", "rep')
    other = Rescorer(judge_file(tmp_path, url, cache=str(cache)), {TASK.id: TASK})
    assert [t.reward for t in other([episode("Lyon")])] == [0.6] and len(judge.requests) == 2


def test_weights_put_the_judge_beside_a_rule_and_the_envs_own_verdict(serve_judge, tmp_path):
    _, url = serve_judge(lambda m: "SCORE: 5")
    beside_qa = judge_file(tmp_path, url, weights={"judge": 1, "qa": 3})
    v = verdict(beside_qa, TASK, "Paris")
    assert v.score == pytest.approx((0.5 + 3 * 1.0) / 4)
    assert v.details["terms"] == {"judge": 0.5, "qa": 1.0} and "f1" in v.details["qa"]
    beside_env = judge_file(tmp_path, url, weights={"judge": 1, "env": 1})
    [t] = Rescorer(beside_env, {TASK.id: TASK})([episode("Paris", reward=1.0)])
    assert t.reward == pytest.approx(0.75) and t.verdict.details["env"] == {"f1": 1.0}
    with pytest.raises(JudgeConfigError, match="rescored"):  # no env verdict where responses come alone
        verdict(beside_env, TASK, "Paris")


@pytest.mark.parametrize("fault", ["junk", "http_500", "http_401", "hang", "down"])
def test_a_judge_that_gives_no_answer_fails_the_episode_and_is_never_a_score(serve_judge, tmp_path, fault):
    replies = {"junk": lambda m: "I think it is fine.", "http_500": lambda m: 500, "http_401": lambda m: 401,
               "hang": lambda m: Hang(3.0), "down": lambda m: "SCORE: 9"}
    judge, url = serve_judge(replies[fault])
    if fault == "down":
        url = f"http://127.0.0.1:{free_port()}"
    name = judge_file(tmp_path, url, retries=2, timeout_s=0.5)
    rescorer = Rescorer(name, {TASK.id: TASK})
    [t] = rescorer([episode("Paris", reward=1.0)])
    assert t.failed and t.stop_reason == "verifier_error" and t.verdict is None and "JudgeUnavailable" in t.error
    stats = rescorer.take_stats()
    assert stats.unavailable == 1
    # a refused request is not asked again, nor a greedy judge's junk (it would say the same); the rest are, twice
    tries = 1 if fault in ("http_401", "junk") else 3
    assert stats.calls == tries and stats.retries == tries - 1
    if fault != "down":
        assert len(judge.requests) == tries
    assert (stats.junk if fault == "junk" else stats.errors) == tries
    with pytest.raises(JudgeUnavailable):
        verdict(name, TASK, "Paris")
    # a group: the whole group fails with it
    group_name = judge_file(tmp_path, url, mode="group", retries=0, timeout_s=0.5)
    got = Rescorer(group_name, {TASK.id: TASK})([episode("a 1"), episode("b 2")])
    assert all(t.failed and t.verdict is None for t in got)


def test_a_flaky_judge_is_asked_again_and_counted(serve_judge, tmp_path):
    answers = iter([500, "no score here", "SCORE: 7"])
    judge, url = serve_judge(lambda m: next(answers))
    rescorer = Rescorer(judge_file(tmp_path, url, retries=2, temperature=0.7), {TASK.id: TASK})  # sampled: junk
    [t] = rescorer([episode("Paris")])  # is worth asking again
    assert not t.failed and t.reward == pytest.approx(0.7)
    stats = rescorer.take_stats()
    assert (stats.calls, stats.retries, stats.errors, stats.junk, stats.unavailable) == (3, 2, 1, 1, 0)
    m = stats.metrics()
    assert m["judge/completion_tokens"] > 0 and m["judge/latency_s"] > 0


def test_a_group_reply_missing_a_member_is_junk(serve_judge, tmp_path):
    judge, url = serve_judge(lambda m: "RESPONSE 1 SCORE: 4")
    name = judge_file(tmp_path, url, mode="group", retries=1, temperature=1.0)
    got = Rescorer(name, {TASK.id: TASK})([episode("a"), episode("b")])
    assert all(t.failed for t in got) and "no score for response(s) [2]" in got[0].error and len(judge.requests) == 2


def test_bad_judge_files_are_one_clear_error(tmp_path):
    def name(text):
        path = tmp_path / f"bad{len(list(tmp_path.iterdir()))}.yaml"
        path.write_text(text)
        return f"judge:{path}"

    cases = [("base_url: http://x/v1\nmodel: m\nrubrik: r\n", "unknown setting 'rubrik' .*did you mean 'rubric'"),
             ("base_url: http://x/v1\nmodel: m\nmode: pairwise\n", "mode must be one of pointwise, group"),
             ("base_url: http://x/v1\nmodel: m\nmode: group\nscore_pattern: 'S(\\d)'\n", "two groups"),
             ("model: m\n", "base_url"), ("- a\n", "mapping"), ("base_url: [\n", "not YAML"),
             ("base_url: http://x/v1\nmodel: m\nweights: {qa: 1}\n", "judge a weight"),
             ("base_url: http://x/v1\nmodel: m\nmode: group\nlabels: {yes: 1}\n", "labels are for a pointwise"),
             ("base_url: http://x/v1\nmodel: m\nlabels: {yes: 2}\n", "scores in \\[0, 1\\]")]
    for text, message in cases:
        with pytest.raises(JudgeConfigError, match=message):
            get_verifier(name(text))
    with pytest.raises(JudgeConfigError, match="cannot read"):
        get_verifier(f"judge:{tmp_path / 'missing.yaml'}")
    group = name("base_url: http://x/v1\nmodel: m\nmode: group\n")
    assert group_verifier(group) is not None
    with pytest.raises(CannotScore, match="group judge"):  # where responses come one at a time
        get_verifier(group)


def test_sleuth_score_and_the_verifier_server_use_a_judge(serve_judge, tmp_path):
    from fastapi.testclient import TestClient

    from sleuth.servers.verifier import create_app
    from sleuth.verifiers.batch import score_file

    _, url = serve_judge(lambda m: "SCORE: 10" if "Paris" in m[-1]["content"].split("Response:")[1] else "SCORE: 0")
    name = judge_file(tmp_path, url)
    records = tmp_path / "answers.jsonl"
    records.write_text(json.dumps({"question": TASK.question, "answer": "Paris", "response": "Paris"}) + "\n"
                       + json.dumps({"question": TASK.question, "answer": "Paris", "response": "Lyon"}) + "\n")
    summary = score_file(name, records, tmp_path / "scored.jsonl", progress=False)
    assert summary["mean_score"] == 0.5 and summary["judge"]["judge/calls"] == 2
    rows = [json.loads(x) for x in (tmp_path / "scored.jsonl").read_text().splitlines()]
    assert [r["score"] for r in rows] == [1.0, 0.0] and rows[0]["details"]["judge"]["reply"] == "SCORE: 10"
    down = judge_file(tmp_path, f"http://127.0.0.1:{free_port()}", retries=0)
    client = TestClient(create_app(down))
    r = client.post("/score", json={"records": [{"question": "q", "answer": "a", "response": "a"}]})
    assert r.status_code == 503 and "gave no usable answer" in r.json()["detail"]  # never a score
