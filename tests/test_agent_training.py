"""Training an unchanged agent through the gateway: each episode's segments train with the episode's own
advantage (computed once per episode), and `sleuth train` with an `agent:` config runs real steps."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sleuth import rewards
from sleuth.agents.trajectory import Trajectory, Turn
from sleuth.rewards.episodes import per_episode

ROOT = Path(__file__).resolve().parents[1]


def segment(episode, i, n, reward, tokens, group="g"):
    turns = [Turn([1] * tokens, [0.0] * tokens, "x")] if tokens else []
    return Trajectory("t", "gateway", [0], turns=turns, reward=reward, group=group, episode=episode, segment=i,
                      segments=n)


def test_an_episodes_segments_count_once_in_its_group_and_share_its_advantage():
    # episodes: a (reward 1, two segments), b (0, one), c (0, three): GRPO over rewards [1, 0, 0] by hand
    trajs = [segment("a", 0, 2, 1.0, 3), segment("a", 1, 2, 1.0, 5), segment("b", 0, 1, 0.0, 4),
             segment("c", 0, 3, 0.0, 2), segment("c", 1, 3, 0.0, 0), segment("c", 2, 3, 0.0, 6)]
    adv = per_episode(rewards.make("grpo"), trajs, {}).values
    r = np.array([1.0, 0.0, 0.0])
    want = (r - r.mean()) / (r.std(ddof=1) + 1e-6)  # counted per segment it would be [1,1,0,0,0,0]: another mean
    assert [a.tolist() for a in adv] == [[want[0]] * 3, [want[0]] * 5, [want[1]] * 4, [want[2]] * 2, [],
                                          [want[2]] * 6]
    single = [segment("", 0, 1, x, 2) for x in (1.0, 0.0)]
    assert [a.tolist() for a in per_episode(rewards.make("grpo"), single, {}).values] == \
        [a.tolist() for a in rewards.make("grpo")(single, {}).values]


@pytest.mark.parametrize(("override", "message"), [
    ("algorithm.estimator=gigpo", "no env state"),
    ("rollout.max_staleness=1", "max_staleness 0"),
    ("agent.entrypoint=nope_agent:run", "nope_agent"),
    ("agent.verifier=qaa", "qaa"),
])
def test_an_agent_config_that_cannot_train_is_refused_before_anything_loads(override, message):
    r = subprocess.run([sys.executable, "-m", "sleuth.cli", "train", "--config", "configs/openai_agent_grpo.yaml",
                        "--set", override], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_sleuth_train_runs_an_openai_sdk_agent_with_a_rewritten_history(tmp_path, tiny_model_dir):
    from sleuth.training.zero import DIST_VARS

    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS} | {"OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "sleuth.cli", "train", "--config", "configs/openai_agent_grpo.yaml",
                        "--out", str(tmp_path), "--set", f"model={tiny_model_dir}",
                        "--set", "agent.entrypoint=coin_agent:run",
                        "--set", f"agent.path={ROOT / 'tests' / 'agents'}", "--set", "rollout.max_tokens=6",
                        "--set", "tasks=hotpotqa:train[0:40]", "--set", "rollout.group_size=4",
                        "--set", "checkpoint.export_hf=false",
                        # a teacher scores the gateway's segments too (the policy itself, shown the answer)
                        "--set", "algorithm.distill.teacher=self", "--set", "algorithm.distill.teacher_context=answer"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    trajs = [Trajectory.from_json(x) for f in sorted((tmp_path / "rollouts").glob("*.jsonl"))
             for x in f.read_text().splitlines()]
    assert len(trajs) == 2 * 2 * 4 * 2 and all(t.segments == 2 for t in trajs)  # steps × tasks × group × segments
    assert all(len(turn.action_ids) == len(turn.action_logprobs) > 0 for t in trajs for turn in t.turns)
    assert all(t.turns[0].policy_version == row["step"] - 1 for row in rows for t in trajs
               if f"@{row['step']}." in t.group)  # each step sampled with the weights synced after the last
    assert all(row["distill/signal_share"] == 1.0 and row["distill/reverse_kl"] != 0 for row in rows)
    signal = [row for row in rows if row["adv/absmax"] > 0]  # the agent's answers differ within groups
    assert signal and all(row["grad_norm"] > 0 for row in signal)  # and the update follows them
