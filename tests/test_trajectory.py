import pytest

from sleuth.agents.trajectory import Trajectory, Turn


def make_traj():
    t1 = Turn([5, 6, 2], [-0.1, -0.2, -0.3], "a", observation_ids=[7, 8], observation="o",
              tool_call={"name": "read", "arguments": {"doc": 1}}, info={"read": {"gold": True}})
    t2 = Turn([9, 2], [-0.5, -0.6], "b", reward=1.0, policy_version=3)
    return Trajectory("task", "sleuth/DocRead-v0", [1, 2, 3], [t1, t2], reward=1.0,
                      verdict={"score": 1.0, "details": {}}, terminated=True, stop_reason="final")


def test_token_views_line_up():
    t = make_traj()
    assert t.token_ids() == [1, 2, 3, 5, 6, 2, 7, 8, 9, 2]
    assert t.loss_mask() == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]
    assert t.sampling_logprobs() == [0, 0, 0, -0.1, -0.2, -0.3, 0, 0, -0.5, -0.6]
    assert t.num_policy_tokens == 5


def test_jsonl_round_trip_is_exact():
    t = make_traj()
    assert Trajectory.from_json(t.to_json()) == t


def test_logprob_count_must_match_ids():
    with pytest.raises(ValueError, match="logprobs"):
        Turn([1, 2], [0.0], "x")
