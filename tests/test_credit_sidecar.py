"""The credit sidecar a training step writes next to its rollouts (rollouts/credit/step-N.rankR.jsonl): the
advantages the update used, per action token, so `sleuth view` shows them without recomputing them."""

import json

import numpy as np

from sleuth.agents.trajectory import Trajectory
from sleuth.training.config import load_config


def test_a_grpo_step_writes_the_advantages_its_update_used(tiny_model_dir, tmp_path):
    from sleuth.training.rl.trainer import Trainer

    cfg = load_config(overrides={
        "model": tiny_model_dir, "out": str(tmp_path / "run"), "env_args": {"harness": "text"}, "task_limit": 8,
        "rollout.max_tokens": 12, "rollout.tasks_per_step": 2, "rollout.group_size": 2,
        "rollout.temperature": 0.7, "checkpoint.export_hf": False, "max_steps": 1})
    trainer = Trainer(cfg, progress=False)
    used = []
    real_update = trainer.updater.update

    def recording_update(trajs, advantages, teacher=None):  # the real update, its inputs kept
        used.extend(zip(trajs, [np.asarray(a, dtype=np.float64) for a in advantages], strict=True))
        return real_update(trajs, advantages, teacher)

    trainer.updater.update = recording_update
    trainer.train()
    rollouts = tmp_path / "run" / "rollouts"
    lines = (rollouts / "step-000001.rank0.jsonl").read_text().splitlines()
    # rollouts/*.jsonl stay trajectories only (what users and tests read); the sidecar is in rollouts/credit/
    assert [Trajectory.from_json(x) for f in rollouts.glob("*.jsonl") for x in f.read_text().splitlines()]
    credit = [json.loads(x) for x in (rollouts / "credit" / "step-000001.rank0.jsonl").read_text().splitlines()]
    assert len(credit) == len(used) == 4
    for row, (traj, adv) in zip(credit, used, strict=True):
        recorded = json.loads(lines[row["line"]])
        assert recorded["task_id"] == row["task_id"] == traj.task_id and row["group"] == traj.group
        n_actions = sum(len(t["action_ids"]) for t in recorded["turns"])
        assert len(row["adv"]) == n_actions == traj.num_policy_tokens
        assert np.allclose(row["adv"], adv)
