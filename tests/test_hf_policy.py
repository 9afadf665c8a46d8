"""The transformers policy's logprobs are those of the distribution each token was sampled from; a directory
that holds no model is refused in one line naming what it lacks."""

from pathlib import Path

import pytest
import torch

from sleuth.agents.policies.base import Request, SamplingParams
from sleuth.agents.policies.hf import TransformersPolicy


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
    """A group's members share their prompt: the prefill runs over the distinct prompts only; each row's
    logprobs are those of a full forward, greedy rows are the ids of their prompt generated alone, and sampled
    members still draw their own continuations."""
    prompts = [[1, 2, 3, 4, 5, 6, 7]] * 3 + [[9, 8]] * 2 + [[40, 41, 42, 43]]
    sampling = SamplingParams(temperature=temperature, max_tokens=10, seed=5)
    policy = TransformersPolicy(tiny_model_dir, device="cpu", max_batch=8, kv_keep_mb=0)
    widths = []
    hook = policy.model.register_forward_pre_hook(
        lambda m, a, kw, widths=widths: widths.append(kw["input_ids"].shape), with_kwargs=True)
    shared = policy.generate([Request(prompt_ids=p, messages=[], task=None) for p in prompts], sampling)
    hook.remove()
    assert widths[0] == (3, 6) and widths[1] == (6, 1)  # 3 distinct prompts, all but the last column; then on
    for gen, prompt in zip(shared, prompts, strict=True):
        assert gen.logprobs == pytest.approx(_teacher_forced(policy, prompt, gen.ids, temperature or 1.0), abs=1e-4)
        if temperature == 0:
            alone = policy.generate([Request(prompt_ids=prompt, messages=[], task=None)], sampling)[0]
            assert gen.ids == alone.ids and gen.logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    if temperature > 0:
        assert len({tuple(g.ids) for g in shared[:3]}) > 1  # the members still sample their own continuations


def _turns(policy: TransformersPolicy, prompts: list[list[int]], sampling: SamplingParams, turns: int = 3):
    """Multi-turn episodes as the loop runs them: each next prompt is the last one + its generation + a reply."""
    history, widths = [], []
    hook = policy.model.register_forward_pre_hook(lambda m, a, kw: widths.append(tuple(kw["input_ids"].shape)),
                                                  with_kwargs=True)
    for turn in range(turns):
        widths.append("call")
        gens = policy.generate([Request(prompt_ids=p, messages=[], task=None) for p in prompts], sampling)
        history.append((prompts, gens))
        prompts = [p + g.ids + [100 + turn, 101 + k] for k, (p, g) in enumerate(zip(prompts, gens, strict=True))]
    hook.remove()
    return history, widths


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_an_episodes_kv_kept_across_turns_samples_as_if_it_were_recomputed(tiny_model_dir, temperature):
    """Turn 2 and 3 prefill only what is new (the last generated token and the reply) and sample the ids and
    logprobs of the path that prefills everything, each row's logprobs those of a full forward."""
    prompts = [[1, 2, 3, 4, 5, 6, 7]] * 2 + [[9, 8]] + [[40, 41, 42, 43]]
    sampling = SamplingParams(temperature=temperature, max_tokens=6, seed=5)
    runs = {}
    for keep in (0, 64):
        policy = TransformersPolicy(tiny_model_dir, device="cpu", max_batch=8, kv_keep_mb=keep)
        runs[keep] = _turns(policy, prompts, sampling)
    (plain, plain_widths), (kept, kept_widths) = runs[0], runs[64]
    for (p_prompts, p_gens), (k_prompts, k_gens) in zip(plain, kept, strict=True):
        assert p_prompts == k_prompts
        for pg, kg, prompt in zip(p_gens, k_gens, k_prompts, strict=True):
            assert kg.ids == pg.ids
            assert kg.logprobs == pytest.approx(pg.logprobs, abs=1e-5)
            assert kg.logprobs == pytest.approx(_teacher_forced(policy, prompt, kg.ids, temperature or 1.0), abs=1e-4)
    calls = [i for i, w in enumerate(kept_widths) if w == "call"]
    second_turn_prefill = kept_widths[calls[1] + 1]
    # 4 distinct rows; the new tokens per row are the last generated one + the 2-token reply: 3, all but
    # the last prefilled before generate, which then runs the last column alone
    assert second_turn_prefill == (4, 2) and kept_widths[calls[1] + 2] == (4, 1)
    assert plain_widths[calls[1] + 1][1] == max(len(p) for p in kept[1][0])  # the full context, every turn


def test_kept_states_are_dropped_when_the_weights_change(tiny_model_dir):
    policy = TransformersPolicy(tiny_model_dir, device="cpu", max_batch=8, kv_keep_mb=64)
    greedy = SamplingParams(temperature=0.0, max_tokens=4)
    gen = policy.generate([Request(prompt_ids=[5, 6, 7, 8], messages=[], task=None)], greedy)[0]
    assert len(policy.prefixes.entries) == 1
    nxt = [5, 6, 7, 8] + gen.ids + [30, 31]
    assert policy.prefixes.lookup(nxt, policy.version).length == 4 + len(gen.ids) - 1
    with torch.no_grad():
        for p in policy.model.parameters():
            p.mul_(1.5)
    policy.version += 1  # what a weight sync does
    widths = []
    hook = policy.model.register_forward_pre_hook(lambda m, a, kw: widths.append(kw["input_ids"].shape[1]),
                                                  with_kwargs=True)
    again = policy.generate([Request(prompt_ids=nxt, messages=[], task=None)], greedy)[0]
    hook.remove()
    assert widths[0] == len(nxt)  # prefilled in full under the new weights
    assert again.logprobs == pytest.approx(_teacher_forced(policy, nxt, again.ids, 1.0), abs=1e-4)


def test_a_prompt_sharing_part_of_a_kept_sequence_reuses_exactly_that_part(tiny_model_dir):
    """An env that rewrites its context (e.g. trims an old observation) shares only a prefix with what was
    kept: its states are reused up to the first differing token, the rest prefilled."""
    policy = TransformersPolicy(tiny_model_dir, device="cpu", max_batch=8, kv_keep_mb=64)
    greedy = SamplingParams(temperature=0.0, max_tokens=5)
    policy.generate([Request(prompt_ids=list(range(1, 11)), messages=[], task=None)], greedy)
    fork = list(range(1, 7)) + [60, 61, 62]
    assert policy.prefixes.lookup(fork, policy.version).length == 6
    gen = policy.generate([Request(prompt_ids=fork, messages=[], task=None)], greedy)[0]
    fresh = TransformersPolicy(tiny_model_dir, device="cpu", max_batch=8, kv_keep_mb=0)
    ref = fresh.generate([Request(prompt_ids=fork, messages=[], task=None)], greedy)[0]
    assert gen.ids == ref.ids and gen.logprobs == pytest.approx(ref.logprobs, abs=1e-5)


@pytest.mark.parametrize("prompt", [[], ["input_ids", "attention_mask"], [1, 2.5]])
def test_a_prompt_that_is_not_token_ids_is_refused_clearly(tiny_model_dir, prompt):
    policy = TransformersPolicy(tiny_model_dir, device="cpu", max_batch=4)
    with pytest.raises(ValueError, match="request 1: prompt_ids must be a non-empty list of token ids"):
        policy.generate([Request(prompt_ids=[1, 2], messages=[], task=None),
                         Request(prompt_ids=prompt, messages=[], task=None)],
                        SamplingParams(max_tokens=2))


@pytest.mark.parametrize("contents, missing", [
    ({}, "no config.json, no weights, no tokenizer files"),
    ({"config.json": "{}"}, "no weights, no tokenizer files"),
])
def test_a_directory_that_is_not_a_model_is_named_in_one_line(tmp_path, contents, missing):
    import subprocess
    import sys

    folder = tmp_path / "not-a-model"
    folder.mkdir()
    for name, text in contents.items():
        (folder / name).write_text(text)
    for argv in (["eval", "--tasks", "hotpotqa:test", "--limit", "1", "--policy", str(folder), "--out",
                  str(tmp_path / "eval")],
                 ["train", "--config", "configs/docread_quick.yaml", "--out", str(tmp_path / "train"), "--set",
                  f"model={folder}"]):
        r = subprocess.run([sys.executable, "-m", "sleuth.cli", *argv], capture_output=True, text=True, timeout=300,
                           cwd=Path(__file__).parents[1])
        lines = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert lines[0].startswith("error: ") and f"{folder} is not a model directory: {missing} (a model " \
            "directory holds config.json, weights such as model.safetensors and tokenizer files such as " \
            "tokenizer.json)" in lines[0]


def test_a_model_directory_passes_the_check_and_a_file_does_not(tiny_model_dir):
    from sleuth.agents.policies.models import NotAModelDirectory, check_model_dir, resolve_model

    assert resolve_model(tiny_model_dir) == tiny_model_dir
    with pytest.raises(NotAModelDirectory, match="is a file, not a model directory"):
        check_model_dir(Path(tiny_model_dir) / "config.json")


def test_a_tiny_model_is_built_from_a_config_and_a_tokenizer_without_weights(tiny_model_dir, tmp_path):
    """The GPU check builds its models where no weights can travel: `tiny_model` reads only the config and the
    tokenizer, while loading a policy from that directory is still refused."""
    import shutil

    from sleuth.agents.policies.models import NotAModelDirectory, resolve_model, tiny_model

    bare = tmp_path / "tok"
    bare.mkdir()
    for f in Path(tiny_model_dir).iterdir():
        if f.name.startswith(("config", "tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, bare / f.name)
    with pytest.raises(NotAModelDirectory, match="no weights"):
        resolve_model(str(bare))
    out = tiny_model(tmp_path / "built", like=str(bare), hidden=32, layers=1)
    assert resolve_model(out) == out
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(out).num_hidden_layers == 1
