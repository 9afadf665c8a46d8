import json

import pytest

from sleuth.agents.trajectory import ReadEvent, Trajectory, Turn
from sleuth.verifiers.base import Verdict


def make_traj():
    t1 = Turn([5, 6, 2], [-0.1, -0.2, -0.3], "a", observation_ids=[7, 8], observation="o",
              tool_call={"name": "read", "arguments": {"doc": 1}}, read=ReadEvent(1, "T", gold=True))
    t2 = Turn([9, 2], [-0.5, -0.6], "b", reward=1.0, policy_version=3)
    return Trajectory("task", "sleuth/DocRead-v0", [1, 2, 3], [t1, t2], reward=1.0,
                      verdict=Verdict(1.0, {"em": 1.0, "prediction": "Ann"}), terminated=True, stop_reason="final")


def test_token_views_line_up():
    t = make_traj()
    assert t.token_ids() == [1, 2, 3, 5, 6, 2, 7, 8, 9, 2]
    assert t.loss_mask() == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]
    assert t.sampling_logprobs() == [0, 0, 0, -0.1, -0.2, -0.3, 0, 0, -0.5, -0.6]
    assert t.num_policy_tokens == 5


def test_jsonl_round_trip_is_exact():
    t = make_traj()
    assert Trajectory.from_json(t.to_json()) == t


def test_the_verdict_is_typed_and_round_trips_through_jsonl_exactly():
    t = make_traj()
    line = t.to_json()
    back = Trajectory.from_json(line)
    assert isinstance(back.verdict, Verdict) and back.verdict == Verdict(1.0, {"em": 1.0, "prediction": "Ann"})
    assert back.to_json() == line
    assert json.loads(line)["verdict"] == {"score": 1.0, "details": back.verdict.details, "response": None}
    scored = Verdict(0.5, {"f1": 0.5}, response="Ann Smith")  # the text scored, kept for a rescoring judge
    assert Verdict.from_dict(json.loads(json.dumps(scored.to_dict()))) == scored
    unscored = Trajectory("t", "env", [1], error="reset failed")
    assert Trajectory.from_json(unscored.to_json()).verdict is None


def test_logprob_count_must_match_ids():
    with pytest.raises(ValueError, match="logprobs"):
        Turn([1, 2], [0.0], "x")


def test_read_event_is_typed():
    t = make_traj()
    back = Trajectory.from_json(t.to_json())
    assert isinstance(back.turns[0].read, ReadEvent) and back.turns[0].read.gold is True
    with pytest.raises(ValueError, match="needs a 'doc'"):
        ReadEvent.from_info({"title": "no doc"})
