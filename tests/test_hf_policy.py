"""The transformers policy's logprobs are those of the distribution each token was sampled from."""

import pytest
import torch

from sleuth.agents.hf import TransformersPolicy
from sleuth.agents.policy import Request, SamplingParams


def _teacher_forced(policy: TransformersPolicy, prompt: list[int], ids: list[int], temperature: float) -> list[float]:
    """Reference: one full forward over the unpadded prompt + generation, logits / temperature."""
    with torch.no_grad():
        logits = policy.model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0].tolist()


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_logprobs_match_a_full_forward(tiny_model_dir, temperature):
    policy = TransformersPolicy(tiny_model_dir, device="cpu", max_batch=4)
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 8], [40, 41, 42, 43]]  # unequal lengths: left padding in one batch
    gens = policy.generate([Request(prompt_ids=p, messages=[], task=None) for p in prompts],
                           SamplingParams(temperature=temperature, max_tokens=12, seed=3))
    for prompt, gen in zip(prompts, gens, strict=True):
        assert len(gen.ids) == len(gen.logprobs) > 0
        ref = _teacher_forced(policy, prompt, gen.ids, temperature or 1.0)
        assert gen.logprobs == pytest.approx(ref, abs=1e-4)
        if temperature == 0.0:  # greedy: every token is the argmax, so its logprob is the row's maximum
            with torch.no_grad():
                logits = policy.model(torch.tensor([prompt + gen.ids])).logits[0, len(prompt) - 1:-1]
            assert gen.ids == logits.argmax(-1).tolist()


def test_rows_that_stop_early_keep_exact_logprobs(tiny_model_dir):
    """A row that reaches a stop token is padded by generate while the others go on; its logprobs end there."""
    policy = TransformersPolicy(tiny_model_dir, device="cpu", max_batch=4)
    prompts = [[5, 6, 7], [11, 12, 13, 14, 15]]
    greedy = SamplingParams(temperature=0.0, max_tokens=10)
    first = policy.generate([Request(prompt_ids=p, messages=[], task=None) for p in prompts], greedy)
    stop = first[0].ids[2]
    assert stop not in first[1].ids[:3], "pick prompts whose greedy continuations differ early"
    policy.stop_ids = [stop]
    gens = policy.generate([Request(prompt_ids=p, messages=[], task=None) for p in prompts], greedy)
    assert gens[0].ids == first[0].ids[:first[0].ids.index(stop) + 1] and gens[0].finish_reason == "stop"
    assert len(gens[1].ids) > len(gens[0].ids)
    for prompt, gen in zip(prompts, gens, strict=True):
        assert gen.logprobs == pytest.approx(_teacher_forced(policy, prompt, gen.ids, 1.0), abs=1e-4)
