"""LoRA on the DeepSpeed engine: only adapters train, and a weight sync sends W + (α/r)·B·A without
touching the frozen weights."""

import pytest
import torch
from train_helpers import fixed_batch, seeded_engine, surrogate

from sleuth.training.rl.losses import LossConfig
from sleuth.training.rl.update import PolicyUpdater, UpdateConfig


def test_lora_update_trains_only_adapters(tiny_model_dir):
    from sleuth.training.zero import LoraConfig, full_state_dict

    engine = seeded_engine(tiny_model_dir, zero_stage=2, lr=1e-2, lora=LoraConfig(r=4))
    trainable = [n for n, p in engine.module.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    base = full_state_dict(engine.module)
    trajs, advs = fixed_batch(4)
    before = surrogate(engine.module, trajs, advs)
    updater = PolicyUpdater(engine, UpdateConfig(micro_batch_tokens=64), LossConfig(), pad_id=0)
    for _ in range(3):
        updater.update(trajs, advs)
    assert surrogate(engine.module, trajs, advs) > before
    merged = full_state_dict(engine.module)
    assert set(merged) == set(base)  # plain architecture names: what a rollout engine loads
    assert any(not torch.equal(merged[k], base[k]) for k in base)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_lora_sync_sends_w_plus_ba_and_leaves_the_frozen_weights_alone(tiny_model_dir, dtype):
    """The synced weights are W + (α/r)·B·A (by hand), the frozen W is bit-identical after several syncs (an
    in-place merge and unmerge rounds it away in bf16), and the rollout engine passes the sync check: its
    logits equal the trainer's merged forward exactly."""
    from sleuth.training.rollout.in_process import TransformersRollout
    from sleuth.training.zero import LoraConfig, full_state_dict

    engine = seeded_engine(tiny_model_dir, zero_stage=0, lr=1e-2, dtype=dtype, lora=LoraConfig(r=4, alpha=8))
    with torch.no_grad():
        for name, p in engine.module.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    params = dict(engine.module.named_parameters())
    frozen = {n: p.detach().clone() for n, p in params.items() if "base_layer" in n}
    rollout = TransformersRollout(tiny_model_dir, "cpu", engine.module.dtype, [1, 2, 3, 4, 5], tolerance=1e-3)
    for _ in range(3):
        state = full_state_dict(engine.module)
        assert rollout.sync(engine.module)["sync/max_logit_diff"] == 0.0
    assert all(torch.equal(params[n], w) for n, w in frozen.items())
    layer = "base_model.model.model.layers.0.self_attn.q_proj"
    a, b = params[f"{layer}.lora_A.default.weight"].float(), params[f"{layer}.lora_B.default.weight"].float()
    by_hand = (frozen[f"{layer}.base_layer.weight"].float() + 2.0 * b @ a).to(engine.module.dtype)
    assert torch.equal(state["model.layers.0.self_attn.q_proj.weight"], by_hand)  # one rounding, not two
    assert not torch.equal(by_hand, frozen[f"{layer}.base_layer.weight"])  # the adapter does move it
