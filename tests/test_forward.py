"""The loss-side forward: the LM head on the scored positions only gives the full forward's logprobs,
entropies and gradients, and a model whose logits are more than the head (soft-capping) keeps its own."""

import pytest
import torch


def _batch(vocab: int):
    torch.manual_seed(0)
    ids = torch.randint(0, vocab, (2, 12))
    attn = torch.ones_like(ids)
    attn[1, 9:] = 0  # right padding
    mask = torch.zeros(2, 12)
    mask[0, 4:7] = 1
    mask[0, 10:] = 1
    mask[1, 6:9] = 1
    return ids, attn, mask


def _grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_scored_forward_matches_the_full_logits_and_their_gradients(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from sleuth.training.rl.forward import ScoredForward
    from sleuth.training.rl.losses import scored_logprobs, token_logprobs

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids, attn, mask = _batch(model.config.vocab_size)
    seen = []
    model.get_output_embeddings().register_forward_hook(lambda m, i, o: seen.append(tuple(i[0].shape)))
    fwd = ScoredForward(model, model, temperature=0.7)

    scored = fwd(ids, attn, mask)
    lp, ent = scored.logprobs(ids, mask, with_entropy=True)
    assert fwd.selective and seen[-1] == (int(mask[:, 1:].sum()), model.config.hidden_size)  # 9 rows, not 24
    (lp.sum() + ent.sum()).backward()
    g_scored = _grads(model)
    model.zero_grad()

    full = model(input_ids=ids, attention_mask=attn).logits / 0.7
    lp_ref, ent_ref = token_logprobs(full, ids, mask, with_entropy=True)
    (lp_ref.sum() + ent_ref.sum()).backward()
    assert torch.allclose(lp, lp_ref, atol=1e-5) and torch.allclose(ent, ent_ref, atol=1e-5)
    assert float(lp.detach()[mask == 0].abs().max()) == 0.0
    assert torch.allclose(g_scored, _grads(model), atol=1e-5)
    # a wrong temperature would show: the same forward at T = 1 gives other logprobs
    lp_t1, _ = scored_logprobs(ScoredForward(model, model)(ids, attn, mask).logits, ids, mask)
    assert float((lp_t1 - lp).abs().max()) > 1e-3


def test_a_model_with_soft_capped_logits_keeps_its_own_logits():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from sleuth.training.rl.forward import ScoredForward
    from sleuth.training.rl.losses import scored_logprobs, token_logprobs

    cfg = Gemma2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=16, final_logit_softcapping=3.0)
    model = Gemma2ForCausalLM(cfg).eval()
    ids, attn, mask = _batch(128)
    fwd = ScoredForward(model, model)
    with torch.no_grad():
        scored = fwd(ids, attn, mask)
        full = model(input_ids=ids, attention_mask=attn).logits
    assert fwd.selective is False
    assert float(scored.logits.abs().max()) <= 3.0  # soft-capped at 3, as the model's own logits are
    assert torch.allclose(token_logprobs(full, ids, mask)[0], scored_logprobs(scored.logits, ids, mask)[0], atol=1e-6)


def test_lora_model_uses_the_base_models_head(tiny_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from sleuth.training.rl.forward import ScoredForward
    from sleuth.training.rl.losses import scored_logprobs, token_logprobs

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    ids, attn, mask = _batch(base.config.vocab_size)
    fwd = ScoredForward(model, model)
    with torch.no_grad():
        lp = scored_logprobs(fwd(ids, attn, mask).logits, ids, mask)[0]
        ref = token_logprobs(model(input_ids=ids, attention_mask=attn).logits, ids, mask)[0]
    assert fwd.selective and torch.allclose(lp, ref, atol=1e-5)


def test_a_batch_without_scored_tokens_gives_empty_logits(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from sleuth.training.rl.forward import ScoredForward

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids, attn, _ = _batch(model.config.vocab_size)
    scored = ScoredForward(model, model)(ids, attn, torch.zeros(2, 12))
    assert scored.logits.shape == (0, model.config.vocab_size)


def _ragged(vocab: int):
    """Three right-padded rows of 12, 7 and 9 real tokens with scored spans in each."""
    torch.manual_seed(1)
    ids = torch.randint(1, vocab, (3, 12))
    attn = torch.ones_like(ids)
    attn[1, 7:] = 0
    attn[2, 9:] = 0
    mask = torch.zeros(3, 12)
    mask[0, 3:6] = mask[0, 9:] = 1
    mask[1, 2:7] = 1
    mask[2, 5:9] = 1
    return ids, attn, mask


def test_packed_forward_gives_the_padded_logprobs_entropies_and_gradients(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from sleuth.training.rl.forward import ScoredForward
    from sleuth.training.rl.losses import scored_logprobs

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids, attn, mask = _ragged(model.config.vocab_size)
    padded = ScoredForward(model, model, temperature=0.7)
    lp, ent = scored_logprobs(padded(ids, attn, mask).logits, ids, mask, with_entropy=True)
    (lp.sum() + ent.sum()).backward()
    g_padded = _grads(model)
    model.zero_grad()

    packed = ScoredForward(model, model, temperature=0.7, packed=True)
    assert packed.uses_packing()
    shapes = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, i, o: shapes.append(tuple(i[0].shape)))
    scored = packed(ids, attn, mask)
    hook.remove()
    assert shapes == [(1, 28)]  # one row of the 12 + 7 + 9 real tokens, no padding
    lp_p, ent_p = scored_logprobs(scored.logits, ids, mask, with_entropy=True)
    (lp_p.sum() + ent_p.sum()).backward()
    assert torch.allclose(lp_p, lp, atol=1e-5) and torch.allclose(ent_p, ent, atol=1e-5)
    assert torch.allclose(scored.hidden[attn.bool()], padded(ids, attn, mask).hidden[attn.bool()], atol=1e-5)
    assert torch.allclose(_grads(model), g_padded, atol=1e-5)


def test_segment_attention_runs_one_causal_call_per_packed_sequence(tiny_model_dir, monkeypatch):
    """A model on SDPA is switched to `segment_attention`: a packed row costs one unmasked causal SDPA call
    per sequence, a padded batch keeps its mask, and both give transformers' own SDPA numbers."""
    import transformers.integrations.sdpa_attention as sdpa
    from transformers import AutoModelForCausalLM

    from sleuth.training.rl.packing import NAME, segments, use_segment_attention

    assert segments(torch.tensor([0, 1, 2, 0, 1, 0, 1, 2, 3])) == [(0, 3), (3, 5), (5, 9)]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ids, attn, _ = _ragged(model.config.vocab_size)
    real = attn.bool()
    with torch.no_grad():
        padded_ref = model(input_ids=ids, attention_mask=attn).logits
    assert use_segment_attention(model) and model.config._attn_implementation == NAME
    calls = []
    inner = sdpa.sdpa_attention_forward

    def spy(module, query, key, value, attention_mask, **kw):
        calls.append((query.shape[2], attention_mask is None, kw.get("is_causal")))
        return inner(module, query, key, value, attention_mask, **kw)

    monkeypatch.setattr(sdpa, "sdpa_attention_forward", spy)
    with torch.no_grad():
        packed = model(input_ids=ids[real][None], position_ids=(attn.cumsum(-1) - 1)[real][None],
                       use_cache=False).logits[0]
        per_layer = calls[:3]
        calls.clear()
        padded = model(input_ids=ids, attention_mask=attn).logits
    assert per_layer == [(12, True, True), (7, True, True), (9, True, True)]
    assert calls and all(not unmasked for _, unmasked, _ in calls)  # the padded batch keeps its mask
    assert torch.allclose(packed, padded_ref[real], atol=1e-5) and torch.allclose(padded, padded_ref, atol=1e-6)


def test_packing_without_restarted_positions_would_show(tiny_model_dir):
    """The comparison above can fail: the same packed row with positions running on across sequences (or
    attention crossing them) gives other logprobs for the second and third sequences."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ids, attn, _ = _ragged(model.config.vocab_size)
    real = attn.bool()
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=attn).logits[real]
        restarted = (attn.cumsum(-1) - 1)[real][None]
        good = model(input_ids=ids[real][None], position_ids=restarted, use_cache=False).logits[0]
        running = model(input_ids=ids[real][None], use_cache=False).logits[0]
    assert torch.allclose(good, padded, atol=1e-5)
    assert float((running[12:] - padded[12:]).abs().max()) > 1e-3


def test_a_model_that_attends_across_packed_sequences_runs_padded(tiny_model_dir):
    """A model that ignores position ids and attends over the whole row is caught before any batch: a
    warning, and the padded forward."""
    from transformers import AutoModelForCausalLM

    from sleuth.training.rl.forward import ScoredForward
    from sleuth.training.rl.losses import scored_logprobs

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)

    def unaware(input_ids, attention_mask=None, position_ids=None, **kw):  # what an old model would do
        return model(input_ids=input_ids, attention_mask=attention_mask, **kw)

    ids, attn, mask = _ragged(model.config.vocab_size)
    fwd = ScoredForward(unaware, model, packed=True)
    with pytest.warns(UserWarning, match="attends across packed sequences"):
        assert not fwd.uses_packing()
    lp = scored_logprobs(fwd(ids, attn, mask).logits, ids, mask)[0]
    ref = scored_logprobs(ScoredForward(model, model)(ids, attn, mask).logits, ids, mask)[0]
    assert torch.allclose(lp, ref, atol=1e-6)


@pytest.mark.parametrize("chunk", [1, 4, 1024])
def test_chunked_logprobs_give_the_same_numbers_and_gradients_and_recompute_the_head(tiny_model_dir, chunk):
    """`Scored.logprobs` applies the head `chunk` positions at a time; with several chunks each chunk's head
    and log-softmax run again in backward (checkpointed), and logprobs, entropies and gradients are those of
    the whole (n, V) logits at once (temperature 0.7)."""
    from transformers import AutoModelForCausalLM

    from sleuth.training.rl.forward import ScoredForward
    from sleuth.training.rl.losses import scored_logprobs

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids, attn, mask = _batch(model.config.vocab_size)
    n = int(mask[:, 1:].sum())  # 9 scored positions
    calls = []
    # the scored positions' head calls take (rows, H); the model's own (B, 1, H) call with logits_to_keep=1 is not one
    def count(module, inputs, output):
        if inputs[0].dim() == 2:
            calls.append(inputs[0].shape[0])

    model.get_output_embeddings().register_forward_hook(count)
    fwd = ScoredForward(model, model, temperature=0.7, chunk=chunk)

    scored = fwd(ids, attn, mask)
    whole_lp, whole_ent = scored_logprobs(scored.logits, ids, mask, with_entropy=True)
    (whole_lp.sum() + 0.3 * whole_ent.sum()).backward()
    g_whole = _grads(model)
    model.zero_grad()
    calls.clear()

    scored = fwd(ids, attn, mask)
    lp, ent = scored.logprobs(ids, mask, with_entropy=True)
    (lp.sum() + 0.3 * ent.sum()).backward()
    chunks = -(-n // chunk)
    # forward: one head call per chunk; backward: each again when there are several (recomputed, not kept)
    assert calls == ([min(chunk, n - i) for i in range(0, n, chunk)] * (2 if chunks > 1 else 1))
    assert torch.allclose(lp, whole_lp.detach(), atol=1e-5) and torch.allclose(ent, whole_ent.detach(), atol=1e-5)
    g = _grads(model)  # fp32 matmuls of other shapes round apart (~1e-6 of the norm); a lost term would be O(1)
    assert float((g - g_whole).norm() / g_whole.norm()) < 1e-5
    with torch.no_grad():  # no gradients: nothing to recompute
        calls.clear()
        fwd(ids, attn, mask).logprobs(ids, mask)
        assert len(calls) == chunks
