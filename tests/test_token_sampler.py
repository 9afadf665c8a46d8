"""The transformers policy's own sampler (`agents/policies/hf.py: TokenSampler`, inverse CDF): its draws follow
softmax(logits / T) after transformers' own top-k and top-p warpers, a token of probability 0 is never drawn,
and the recorded logprob is the drawn token's under logits / T."""

import pytest
import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from sleuth.agents.policies.hf import TokenSampler, sample_inverse_cdf

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, float("-inf")])
N = 40_000


def _frequencies(tokens: torch.Tensor) -> torch.Tensor:
    return torch.bincount(tokens, minlength=len(LOGITS)).double() / len(tokens)


def _expected(temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """transformers' warpers, in generate's order (temperature, top-k, top-p), then a softmax."""
    scores = TemperatureLogitsWarper(temperature)(None, LOGITS[None].clone())
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return scores.softmax(-1)[0].double()


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 3, 1.0), (1.0, 0, 0.8),
                                                     (0.9, 4, 0.6)])
def test_draws_follow_the_warped_distribution(temperature, top_k, top_p):
    torch.manual_seed(0)
    probs = torch.softmax(LOGITS / temperature, -1).expand(N, -1)
    freq = _frequencies(sample_inverse_cdf(probs, top_p, top_k))
    want = _expected(temperature, top_k, top_p)
    sigma = (want * (1 - want) / N).sqrt()
    assert torch.all((freq - want).abs() <= 5 * sigma + 1e-12), (freq, want)
    assert freq[want == 0].sum() == 0  # never a token outside top-k / top-p, never the -inf one


def test_a_zero_probability_token_in_front_is_never_drawn_even_at_u_zero(monkeypatch):
    probs = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.zeros(1, 1, dtype=torch.float64))
    assert sample_inverse_cdf(probs).tolist() == [2]
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.full((1, 1), 1 - 2 ** -53, dtype=torch.float64))
    assert sample_inverse_cdf(probs).tolist() == [2]  # the top of the last interval: still the token itself


def test_the_processor_leaves_one_token_for_greedy_generate_and_records_its_logprob_at_t():
    torch.manual_seed(1)
    scores = torch.randn(3, 50)
    sampler = TokenSampler(0.7)
    out = sampler(torch.zeros(3, 4, dtype=torch.long), scores.clone())
    token = out.argmax(-1)
    assert torch.isfinite(out).sum().item() == 3  # one finite score a row: what greedy decoding takes
    lps = sampler.finish(token)
    assert torch.allclose(lps[:, 0], torch.log_softmax(scores / 0.7, -1).gather(-1, token[:, None])[:, 0])
    greedy = TokenSampler(0.0)
    assert torch.equal(greedy(torch.zeros(3, 4, dtype=torch.long), scores.clone()), scores)  # argmax: generate's
    assert torch.allclose(greedy.finish(scores.argmax(-1))[:, 0], torch.log_softmax(scores, -1).max(-1).values)
