"""The DeepSpeed engine and the policy update: accumulation, ZeRO stages in one and two processes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from train_helpers import fixed_batch, surrogate

from sleuth.training.engine import DIST_VARS, EngineConfig, build_engine, init_distributed
from sleuth.training.losses import LossConfig
from sleuth.training.update import PolicyUpdater

HERE = Path(__file__).resolve().parent


def _engine(model_dir, **kw):
    from transformers import AutoModelForCausalLM

    init_distributed()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return build_engine(model, EngineConfig(**kw))


def _grads_of_one_update(engine, micro_batch_tokens, loss_cfg):
    grads = {}

    def capture():  # stage 0: after the backwards, the accumulated gradients sit in p.grad
        for n, p in engine.module.named_parameters():
            grads[n] = p.grad.detach().clone()
            p.grad = None

    engine.step, engine.get_global_grad_norm = capture, lambda: 0.0
    trajs, advs = fixed_batch(6)
    PolicyUpdater(engine, loss_cfg, pad_id=0, micro_batch_tokens=micro_batch_tokens).update(trajs, advs)
    return grads


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_micro_batches_give_the_same_gradient_as_one_batch(tiny_model_dir, aggregation):
    engine = _engine(tiny_model_dir, zero_stage=0, grad_clip=0.0)
    cfg = LossConfig(aggregation=aggregation, entropy_coef=0.01)
    whole = _grads_of_one_update(engine, 10_000, cfg)  # one micro-batch of all six
    split = _grads_of_one_update(engine, 1, cfg)  # six micro-batches of one
    assert max(float(g.abs().max()) for g in whole.values()) > 0
    for name, g in whole.items():
        assert torch.allclose(g, split[name], atol=1e-6, rtol=1e-4), name


@pytest.mark.parametrize("stage, offload", [(2, False), (3, False), (2, True)])
def test_zero_stage_update_improves_the_objective_in_one_process(tiny_model_dir, stage, offload):
    engine = _engine(tiny_model_dir, zero_stage=stage, lr=1e-3, offload=offload)
    trajs, advs = fixed_batch(4)
    updater = PolicyUpdater(engine, LossConfig(), pad_id=0, micro_batch_tokens=64)
    before = surrogate(engine.module, trajs, advs)
    for _ in range(3):
        stats = updater.update(trajs, advs)
    assert stats["grad_norm"] > 0
    assert surrogate(engine.module, trajs, advs) > before + 0.05


def test_lora_update_trains_only_adapters(tiny_model_dir):
    from sleuth.training.engine import LoraConfig, full_state_dict

    engine = _engine(tiny_model_dir, zero_stage=2, lr=1e-2, lora=LoraConfig(r=4))
    trainable = [n for n, p in engine.module.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    base = full_state_dict(engine.module)
    trajs, advs = fixed_batch(4)
    before = surrogate(engine.module, trajs, advs)
    updater = PolicyUpdater(engine, LossConfig(), pad_id=0, micro_batch_tokens=64)
    for _ in range(3):
        updater.update(trajs, advs)
    assert surrogate(engine.module, trajs, advs) > before
    merged = full_state_dict(engine.module)
    assert set(merged) == set(base)  # plain architecture names: what a rollout engine loads
    assert any(not torch.equal(merged[k], base[k]) for k in base)


def test_two_processes_zero2_and_zero3(tiny_model_dir, tmp_path):
    out = tmp_path / "result.json"
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS} | {"OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_port", str(_port()), str(HERE / "dist_train_worker.py"), tiny_model_dir,
                           str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["world"] == 2
    for stage in ("zero2", "zero3"):
        assert res[stage]["after"] > res[stage]["before"] + 0.05, res


def _port():
    from sleuth.serving import free_port

    return free_port()
