"""Weights over the network (`training/sync/weight_stream.py`): the bucket plan by hand, and a real gloo group between
two processes broadcasting a model's weights bucket by bucket into another copy, exactly."""

import multiprocessing as mp
import os

import pytest
import torch

from sleuth.training.sync.weight_stream import Rendezvous, Slot, bucket_plan, join, plan_bytes, receive, send


def test_the_bucket_plan_packs_in_order_by_dtype_and_size():
    tensors = {"a": torch.zeros(3), "b": torch.zeros(2, 2), "c": torch.zeros(10),
               "d": torch.zeros(2, dtype=torch.int64), "e": torch.zeros(1)}
    plan = bucket_plan(tensors, bucket_bytes=32)  # 8 float32 elements a bucket
    assert [b.dtype for b in plan] == ["float32", "float32", "int64", "float32"]
    assert plan[0].slots == (Slot("a", (3,), 0), Slot("b", (2, 2), 3))  # 12 + 16 = 28 B ≤ 32
    assert plan[1].slots == (Slot("c", (10,), 0),)  # 40 B: a bucket of its own, larger than the limit
    assert plan[2].slots == (Slot("d", (2,), 0),)  # another dtype starts a bucket
    assert plan[3].slots == (Slot("e", (1,), 0),)
    assert [b.numel for b in plan] == [7, 10, 2, 1] and plan_bytes(plan) == 7 * 4 + 40 + 16 + 4
    with pytest.raises(ValueError, match="at least one byte"):
        bucket_plan(tensors, 0)


def _receiver(port, prefix, plan, state, out):
    torch.manual_seed(1)
    mine = {k: torch.randn_like(v) for k, v in state.items()}
    group = join("127.0.0.1", port, prefix, 1, 2, "gloo", 180.0)
    receive(group, mine, plan, torch.device("cpu"))
    group.shutdown()
    # numpy arrays pickle by value; a tensor would travel as a file descriptor that this process must still be
    # alive to hand over, and it exits right after the put
    out.put({k: v.numpy().copy() for k, v in mine.items()})


def test_a_gloo_broadcast_between_processes_fills_the_other_copy_exactly_bucket_by_bucket():
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model("llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    plan = bucket_plan(state, bucket_bytes=4096)
    assert len(plan) > 5  # several buckets, so the offsets matter
    rdv = Rendezvous("127.0.0.1", 180.0)  # the spawned child imports torch first: slow on a loaded machine
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    prefix = rdv.next_prefix()
    proc = ctx.Process(target=_receiver, args=(rdv.port, prefix, plan, {k: v.clone() for k, v in state.items()}, out))
    proc.start()
    group = join("127.0.0.1", rdv.port, prefix, 0, 2, "gloo", 180.0, store=rdv.store)
    sent = send(group, state, plan, torch.device("cpu"))
    group.shutdown()
    got = out.get(timeout=180)
    proc.join(30)
    assert sent == plan_bytes(plan) == sum(v.numel() * v.element_size() for v in state.values())
    assert got.keys() == state.keys() and all(torch.equal(torch.from_numpy(got[k]), state[k]) for k in state)


def test_a_plan_that_does_not_fit_the_receiving_model_is_refused_by_name():
    with pytest.raises(KeyError, match="lm_head.weight"):
        receive(None, {"x": torch.zeros(2)}, bucket_plan({"lm_head.weight": torch.zeros(2)}, 64), torch.device("cpu"))


def _dies_after_one_bucket(port, prefix, plan):
    group = join("127.0.0.1", port, prefix, 1, 2, "gloo", 180.0)
    first = plan[0]
    group.broadcast(torch.empty(first.numel, dtype=getattr(torch, first.dtype)), 0).wait()
    os._exit(1)  # killed mid-sync: its sockets close with the process


def test_a_member_that_dies_mid_broadcast_fails_the_sender_at_once_not_at_its_timeout():
    """The sender learns of a dead member from its closed connection (a RuntimeError, which `CollectiveSync`
    takes as a broken generation and syncs again), long before the group's timeout."""
    import time

    state = {f"w{i}": torch.randn(1 << 20) for i in range(6)}  # 6 buckets of 4 MB: more than a socket buffers
    plan = bucket_plan(state, bucket_bytes=4 << 20)
    rdv = Rendezvous("127.0.0.1", 180.0)
    prefix = rdv.next_prefix()
    proc = mp.get_context("spawn").Process(target=_dies_after_one_bucket, args=(rdv.port, prefix, plan))
    proc.start()
    group = join("127.0.0.1", rdv.port, prefix, 0, 2, "gloo", 120.0, store=rdv.store)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError):
        send(group, state, plan, torch.device("cpu"))
    assert time.monotonic() - t0 < 60
    group.abort()
    proc.join(30)
