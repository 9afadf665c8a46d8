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


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_shared_prompt_is_prefilled_once_and_samples_as_if_it_were_not(tiny_model_dir, temperature):
    """A group's members share their prompt: the prefill runs over the distinct prompts only, and the ids
    and logprobs are those of the unshared path (same seed), each row's logprobs those of a full forward."""
    prompts = [[1, 2, 3, 4, 5, 6, 7]] * 3 + [[9, 8]] * 2 + [[40, 41, 42, 43]]
    sampling = SamplingParams(temperature=temperature, max_tokens=10, seed=5)
    runs = {}
    for share in (False, True):
        policy = TransformersPolicy(tiny_model_dir, device="cpu", max_batch=8, share_prefill=share)
        widths = []
        hook = policy.model.register_forward_pre_hook(lambda m, a, kw, widths=widths: widths.append(kw["input_ids"].shape),
                                                      with_kwargs=True)
        runs[share] = policy.generate([Request(prompt_ids=p, messages=[], task=None) for p in prompts], sampling)
        hook.remove()
        if share:  # the first forward: 3 distinct prompts, all but the last column; generate then goes on from it
            assert widths[0] == (3, 6) and widths[1] == (6, 1)
        else:
            assert widths[0] == (6, 7)
    for plain, shared, prompt in zip(runs[False], runs[True], prompts, strict=True):
        assert shared.ids == plain.ids
        assert shared.logprobs == pytest.approx(plain.logprobs, abs=1e-5)
        assert shared.logprobs == pytest.approx(_teacher_forced(policy, prompt, shared.ids, temperature or 1.0), abs=1e-4)
    if temperature > 0:
        assert len({tuple(g.ids) for g in runs[True][:3]}) > 1  # the members still sample their own continuations
