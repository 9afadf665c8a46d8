"""Shared by the training tests (and the two-process worker): a fixed batch of synthetic trajectories."""

import numpy as np

from sleuth.agents.trajectory import Trajectory, Turn


def fixed_batch(n: int = 4, seed: int = 0, vocab: int = 400):
    """n two-turn trajectories with distinct ids; the first half gets advantage +1, the rest −1."""
    rng = np.random.default_rng(seed)
    trajs, advs = [], []
    for i in range(n):
        turns = []
        for _ in range(2):
            k = int(rng.integers(3, 7))
            turns.append(Turn(rng.integers(10, vocab, k).tolist(), [0.0] * k, "a",
                              observation_ids=rng.integers(10, vocab, 3).tolist()))
        t = Trajectory(f"t{i}", "env", rng.integers(10, vocab, 5).tolist(), turns=turns, group="g")
        trajs.append(t)
        advs.append(np.full(t.num_policy_tokens, 1.0 if i < n // 2 else -1.0))
    return trajs, advs


def surrogate(module, trajs, advs):
    """Σ_i Σ_t A·log π over policy tokens / tokens: the objective a policy-gradient step increases."""
    import torch

    from sleuth.training.rl.batch import build_batch
    from sleuth.training.rl.losses import token_logprobs

    b = build_batch(trajs, advs, pad_id=0)
    with torch.no_grad():
        logits = module(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
        lp, _ = token_logprobs(logits, b.input_ids, b.loss_mask)
    return float((lp * b.advantages * b.loss_mask).sum() / b.loss_mask.sum())


def grouped_batch(groups: int = 2, members: int = 3, prompt_len: int = 24, seed: int = 0, vocab: int = 400):
    """`groups` groups of `members` two-turn trajectories, each group's members starting from one prompt;
    advantages ±1 alternating inside each group."""
    rng = np.random.default_rng(seed)
    trajs, advs = [], []
    for g in range(groups):
        prompt = rng.integers(10, vocab, prompt_len).tolist()
        for m in range(members):
            actions = [rng.integers(10, vocab, int(rng.integers(3, 7))).tolist() for _ in range(2)]
            turns = [Turn(a, [0.0] * len(a), "a", observation_ids=rng.integers(10, vocab, 3).tolist())
                     for a in actions]
            t = Trajectory(f"t{g}", "env", prompt, turns=turns, group=f"g{g}")
            trajs.append(t)
            advs.append(np.full(t.num_policy_tokens, 1.0 if m % 2 == 0 else -1.0))
    return trajs, advs


def seeded_engine(model_dir, **kw):
    """The tiny model, fp32 and seeded, in a DeepSpeed engine built from `DeepSpeedConfig(**kw)`."""
    import torch
    from transformers import AutoModelForCausalLM

    from sleuth.training.zero import DeepSpeedConfig, build_engine, init_distributed

    init_distributed()
    torch.manual_seed(0)
    return build_engine(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), DeepSpeedConfig(**kw))
