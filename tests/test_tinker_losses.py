"""Tinker's losses as the server computes them (sleuth's loss module underneath), against values and gradients
computed by hand from Tinker's definitions (sums over tokens: tinker-docs.thinkingmachines.ai/tinker/losses)."""

from __future__ import annotations

import math

import pytest
import torch

from sleuth.servers.tinker.losses import LossBatch, LossInputError, check_loss, loss_sum

E5 = math.exp(0.5)  # the ratio of the tokens whose logprob rose from -1 to -0.5
EM1 = math.exp(-1.0)  # ... and of the one that fell from -1 to -2
# p_θ's logprobs per token, the sampler's (q), the advantages; the last position is padding (mask 0) whose
# values would change every loss if it were counted
LP = [-1.0, -0.5, -2.0, -0.5, -0.1]
Q = [-1.0, -1.0, -1.0, -1.0, -9.0]
A = [1.0, 1.0, 2.0, -1.0, 5.0]


def _batch(weights=None):
    lp = torch.tensor([LP], requires_grad=True)
    mask = torch.tensor([[1.0, 1, 1, 1, 0]])
    w = torch.tensor([weights]) if weights else None
    return lp, LossBatch(lp, mask, w, torch.tensor([Q]), torch.tensor([A]))


def _value_and_grad(loss_fn, config=None, weights=None):
    lp, batch = _batch(weights)
    loss = loss_sum(loss_fn, config or {}, batch)
    loss.backward()
    return float(loss.detach()), lp.grad[0].tolist()


def test_cross_entropy_is_the_weighted_negative_logprob_sum():
    value, grad = _value_and_grad("cross_entropy", weights=[1.0, 0.5, 0.0, 2.0, 7.0])
    assert value == pytest.approx(1.0 + 0.25 + 0.0 + 1.0)
    assert grad == pytest.approx([-1.0, -0.5, 0.0, -2.0, 0.0])


def test_importance_sampling_is_the_unclipped_ratio_times_advantage():
    value, grad = _value_and_grad("importance_sampling")
    per_token = [-1.0, -E5, -2 * EM1, E5]  # -A·p/q; its gradient in log p is the same
    assert value == pytest.approx(sum(per_token), rel=1e-6)
    assert grad == pytest.approx(per_token + [0.0], rel=1e-6)


def test_ppo_clips_at_tinkers_default_thresholds():
    value, grad = _value_and_grad("ppo")
    # token 1: A > 0 and p/q = e^0.5 > 1.2, so the objective is 1.2·A, flat in θ; token 3: A < 0 with the
    # ratio above the clip keeps the unclipped (smaller) objective -e^0.5 and its gradient
    assert value == pytest.approx(-1.0 - 1.2 - 2 * EM1 + E5, rel=1e-6)
    assert grad == pytest.approx([-1.0, 0.0, -2 * EM1, E5, 0.0], rel=1e-6)


def test_ppo_reads_its_thresholds_from_the_config():
    value, grad = _value_and_grad("ppo", {"clip_low_threshold": 0.5, "clip_high_threshold": 1.5})
    # token 2's ratio e^-1 ≈ 0.37 < 0.5 with A > 0: min(0.37·2, 0.5·2) keeps the unclipped term
    assert value == pytest.approx(-1.0 - 1.5 - 2 * EM1 + E5, rel=1e-6)
    assert grad == pytest.approx([-1.0, 0.0, -2 * EM1, E5, 0.0], rel=1e-6)


def test_cispo_weights_the_logprob_by_the_detached_clipped_ratio():
    value, grad = _value_and_grad("cispo")
    clipped = [1.0, 1.2, 0.8, 1.2]
    assert value == pytest.approx(sum(-c * a * lp for c, a, lp in zip(clipped, A, LP, strict=False)), rel=1e-6)
    # sg(clip(r)): the gradient in log p is -clip(r)·A, with no term from the ratio itself
    assert grad == pytest.approx([-c * a for c, a in zip(clipped, A, strict=False)] + [0.0], rel=1e-6)


def test_a_loss_this_server_does_not_compute_is_refused_naming_the_ones_it_does():
    with pytest.raises(LossInputError, match="cross_entropy, importance_sampling, ppo, cispo"):
        check_loss("dro", {"beta": 0.05})
    with pytest.raises(LossInputError, match="beta"):
        check_loss("ppo", {"beta": 0.05})
    with pytest.raises(LossInputError, match="clip_low_threshold ≤ 1"):
        check_loss("cispo", {"clip_low_threshold": 1.5})


def test_an_input_the_loss_would_not_read_is_refused_not_ignored(tiny_model_dir):
    """Per-token clip thresholds (the SDK lets a datum carry them) would be silently ignored otherwise."""
    import numpy as np

    from sleuth.servers.tinker.lora import AdapterSpec, LoraModels
    from sleuth.servers.tinker.wire import WireDatum

    models = LoraModels(tiny_model_dir, "local/tiny")
    models.create("m", AdapterSpec("local/tiny", 2))
    ids = np.arange(5, 10)
    inputs = {"target_tokens": ids, "logprobs": np.zeros(5, np.float32), "advantages": np.ones(5, np.float32),
              "clip_low_threshold": np.full(5, 0.5, np.float32)}
    with pytest.raises(LossInputError, match=r"\['clip_low_threshold'\] are not read by ppo"):
        models.forward_backward("m", [WireDatum(ids, inputs)], "ppo", {}, False)
    del inputs["clip_low_threshold"]
    outputs, metrics = models.forward_backward("m", [WireDatum(ids, inputs)], "ppo", {}, False)
    assert outputs[0]["logprobs"].shape == (5,) and "loss:sum" in metrics
