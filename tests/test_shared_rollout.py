"""One copy of the weights in one process (`training/rollout/in_process.py::SharedRollout`): the engine runs
the trainer's own module, and every number a run produces — sampled tokens and their logprobs, losses,
gradients, updated weights — is the one the engine with its own synced copy produces."""

import dataclasses

import numpy as np
import pytest
import torch
from train_helpers import seeded_engine

from sleuth.agents.policies.base import Request, SamplingParams
from sleuth.agents.trajectory import Trajectory, Turn
from sleuth.training.rl.losses import LossConfig
from sleuth.training.rl.update import PolicyUpdater, UpdateConfig
from sleuth.training.rollout.in_process import SharedRollout, TransformersRollout, WeightSyncError

PROMPTS = [[1, 17, 230, 41, 9], [1, 88, 12, 301, 5, 77, 3]]


def _run(model_dir: str, shared: bool, zero_stage: int, dtype: str, steps: int = 3) -> list[dict]:
    """`steps` rounds of: two turns per episode (the second continues the first: kept KV states), a group of
    2 per prompt, advantages from the sampled tokens, one update, one sync. What each round saw and did."""
    engine = seeded_engine(model_dir, zero_stage=zero_stage, lr=5e-2, dtype=dtype)
    module = engine.module
    rollout = SharedRollout(module, model_dir, "cpu", max_batch=8) if shared else \
        TransformersRollout(model_dir, "cpu", module.dtype, [1, 2, 3], tolerance=0.0, max_batch=8)
    rollout.sync(module)
    grads: list[dict[str, torch.Tensor]] = []
    inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
    inner.register_step_pre_hook(lambda opt, *_: grads.append(
        {str(i): p.grad.detach().clone() for i, g in enumerate(opt.param_groups) for p in g["params"]
         if p.grad is not None}))
    updater = PolicyUpdater(engine, UpdateConfig(micro_batch_tokens=256), LossConfig(), pad_id=0)
    seen = []
    for step in range(steps):
        sampling = SamplingParams(temperature=1.0, max_tokens=6, seed=100 + step)
        first = rollout.policy.generate([Request(p, [], None) for p in PROMPTS for _ in range(2)], sampling)
        second = rollout.policy.generate([Request(p + g.ids + [5, 6], [], None)
                                          for p, g in zip([p for p in PROMPTS for _ in range(2)], first,
                                                          strict=True)], sampling)
        trajs = []
        for k, (a, b) in enumerate(zip(first, second, strict=True)):
            turns = [Turn(a.ids, a.logprobs, a.text, observation_ids=[5, 6]), Turn(b.ids, b.logprobs, b.text)]
            trajs.append(Trajectory(f"t{k // 2}", "env", PROMPTS[k // 2], turns=turns, group=f"g{k // 2}",
                                    reward=float(sum(a.ids) % 7)))
        rewards = np.array([t.reward for t in trajs])
        advs = [np.full(t.num_policy_tokens, rewards[k] - rewards[k ^ 1]) for k, t in enumerate(trajs)]
        stats = updater.update(trajs, advs)
        rollout.sync(module)
        seen.append({"ids": [g.ids for g in first + second], "logprobs": [g.logprobs for g in first + second],
                     "stats": dataclasses.asdict(stats), "grads": grads[-1] if grads else {},
                     "weights": {n: p.detach().clone() for n, p in module.named_parameters()}})
    return seen


@pytest.mark.parametrize("zero_stage,dtype", [(0, "fp32"), (2, "fp32"), (0, "bf16")])
def test_a_run_on_the_shared_module_samples_trains_and_moves_the_weights_exactly_as_one_on_a_copy(
        tiny_model_dir, zero_stage, dtype):
    copy = _run(tiny_model_dir, shared=False, zero_stage=zero_stage, dtype=dtype)
    shared = _run(tiny_model_dir, shared=True, zero_stage=zero_stage, dtype=dtype)
    assert any(len(set(map(tuple, s["ids"]))) > 1 for s in copy)  # sampled, not one fixed reply
    for a, b in zip(copy, shared, strict=True):
        assert a["ids"] == b["ids"] and a["logprobs"] == b["logprobs"]
        assert a["stats"] == b["stats"]  # losses, ratios, clip fractions, mismatch, grad norm: all of it
        assert a["grads"].keys() == b["grads"].keys() and all(torch.equal(a["grads"][k], b["grads"][k])
                                                              for k in a["grads"])
        assert all(torch.equal(a["weights"][k], b["weights"][k]) for k in a["weights"])
    assert copy[0]["stats"]["grad_norm"] > 0 and not all(
        torch.equal(copy[0]["weights"][k], copy[-1]["weights"][k]) for k in copy[0]["weights"])  # it trained


def test_the_shared_engine_runs_in_eval_mode_after_a_sync_and_refuses_another_module(tiny_model_dir):
    engine = seeded_engine(tiny_model_dir, zero_stage=0)
    rollout = SharedRollout(engine.module, tiny_model_dir, "cpu")
    engine.train()
    assert rollout.sync(engine.module) == {} and not engine.module.training and rollout.policy.version == 1
    assert rollout.policy.model is engine.module
    with pytest.raises(WeightSyncError, match="the trainer.s own module"):
        rollout.sync(torch.nn.Linear(2, 2))


def test_the_trainer_shares_its_module_only_where_the_module_holds_whole_weights_and_no_rollout_overlaps(
        tiny_model_dir):
    from sleuth.training.cluster.placement import ClusterConfig
    from sleuth.training.config import RolloutConfig
    from sleuth.training.rollout.factory import make_rollout
    from sleuth.training.zero import DeepSpeedConfig, LoraConfig

    module = seeded_engine(tiny_model_dir, zero_stage=0).module

    def built(rollout: RolloutConfig, engine: DeepSpeedConfig) -> type:
        return type(make_rollout(rollout, ClusterConfig(), UpdateConfig(), engine, module, tiny_model_dir,
                                 torch.float32, [1, 2, 3]))

    assert built(RolloutConfig(), DeepSpeedConfig(zero_stage=0)) is SharedRollout
    assert built(RolloutConfig(), DeepSpeedConfig(zero_stage=2)) is SharedRollout
    assert built(RolloutConfig(), DeepSpeedConfig(zero_stage=3)) is TransformersRollout  # a shard per rank
    assert built(RolloutConfig(), DeepSpeedConfig(lora=LoraConfig(r=4))) is TransformersRollout  # merged for rollouts
    assert built(RolloutConfig(max_staleness=1), DeepSpeedConfig()) is TransformersRollout  # rollouts during updates
