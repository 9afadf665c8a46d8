"""Shared prefixes in packed rows (`training.rl.packing.layout`): a group's prompt laid out once, branches of one
episode nested inside it, and every sequence's logprobs, entropies and gradients still its own."""

import torch


def _grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_layout_lays_a_common_prefix_out_once():
    """Hand case: two sequences sharing their first 16 tokens and one that shares nothing."""
    from sleuth.training.rl.packing import MIN_SHARED, layout

    p = list(range(100, 100 + MIN_SHARED))
    a, b, c = [*p, 1, 2], [*p, 3, 4, 5], list(range(200, 204))
    row = layout([a, b, c])
    assert row.ids == [*p, 1, 2, 3, 4, 5, *c]
    assert row.positions == [*range(16), 16, 17, 16, 17, 18, *range(4)]
    assert row.blocks == ((0, 16, ()), (16, 18, ((0, 16),)), (18, 21, ((0, 16),)), (21, 25, ()))
    assert row.sources == [[*range(16), 16, 17], [*range(16), 18, 19, 20], [21, 22, 23, 24]]
    assert layout([a, b, c], share=False).tokens == len(a) + len(b) + len(c)
    short = [*p[:MIN_SHARED - 1], 9]  # one token short of MIN_SHARED in common: not worth an attention call
    assert layout([a, short]).tokens == len(a) + len(short)
    # a third member shrinks the group's prefix to what all three share
    q = list(range(300, 320))
    row = layout([[*q, 1], [*q, 2], [*q[:17], 8]])
    assert row.tokens == 17 + 4 + 4 + 1 and row.blocks[0] == (0, 17, ())
    assert row.positions == [*range(17), 17, 18, 19, 20, 17, 18, 19, 20, 17]


def test_layout_nests_branches_of_one_episode_inside_their_groups_prompt():
    """Hand case: two episodes of one prompt P, and two branches of the first from its context P + C: P once,
    C once (inside P), and each branch only its own tokens, attending to both spans."""
    from sleuth.training.rl.packing import MIN_SHARED, layout

    p, c = list(range(100, 100 + MIN_SHARED)), list(range(200, 200 + MIN_SHARED))
    ep1, ep2, b1, b2 = [*p, *c, 1], [*p, 7, 8], [*p, *c, 2, 3], [*p, *c, 4]
    row = layout([ep1, ep2, b1, b2])
    assert row.tokens == 16 + 16 + 1 + 2 + 1 + 2
    assert row.ids == [*p, *c, 1, 2, 3, 4, 7, 8]
    assert row.blocks == ((0, 16, ()), (16, 32, ((0, 16),)), (32, 33, ((0, 16), (16, 32))),
                          (33, 35, ((0, 16), (16, 32))), (35, 36, ((0, 16), (16, 32))), (36, 38, ((0, 16),)))
    assert row.positions == [*range(32), 32, 32, 33, 32, 16, 17]
    assert [[row.ids[i] for i in s] for s in row.sources] == [ep1, ep2, b1, b2]


def test_nested_prefixes_give_each_sequence_its_own_logits(tiny_model_dir):
    """Branches inside a group's prompt, in one row: every token's logits are those of its sequence run alone."""
    from transformers import AutoModelForCausalLM

    from sleuth.training.rl.packing import layout, use_segment_attention

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    use_segment_attention(model)
    torch.manual_seed(3)
    v = model.config.vocab_size
    p, c = torch.randint(1, v, (20,)).tolist(), torch.randint(1, v, (18,)).tolist()
    seqs = [[*p, *c, *torch.randint(1, v, (n,)).tolist()] for n in (5, 3, 4)]
    seqs.append([*p, *torch.randint(1, v, (6,)).tolist()])
    row = layout(seqs)
    assert row.tokens == 20 + 18 + 5 + 3 + 4 + 6
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(row.ids)[None], position_ids=torch.tensor(row.positions)[None],
                       use_cache=False, sleuth_blocks=row.blocks).logits[0]
        for s, src in zip(seqs, row.sources, strict=True):
            alone = model(input_ids=torch.tensor(s)[None]).logits[0]
            assert torch.allclose(logits[src], alone, atol=1e-5)


def _group_rows(vocab: int):
    """A GRPO-like micro-batch: three completions of one 20-token prompt and one unrelated sequence,
    right-padded, each completion scored."""
    torch.manual_seed(2)
    prompt = torch.randint(1, vocab, (20,))
    rows = [torch.cat([prompt, torch.randint(1, vocab, (n,))]) for n in (6, 3, 8)] + [torch.randint(1, vocab, (11,))]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attn = torch.zeros_like(ids)
    mask = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        ids[i, :len(r)], attn[i, :len(r)] = r, 1
        mask[i, 20:len(r)] = 1 if i < 3 else 0
    mask[3, 4:11] = 1
    return ids, attn, mask


def test_a_shared_prompt_runs_once_and_gives_each_members_own_numbers(tiny_model_dir):
    """Three completions of one prompt: the packed row holds the prompt once (20 + 6 + 3 + 8 + 11 tokens, not
    20 more per member), and logprobs, entropies, hidden states and parameter gradients are the padded
    batch's."""
    from transformers import AutoModelForCausalLM

    from sleuth.training.rl.forward import ScoredForward
    from sleuth.training.rl.losses import scored_logprobs

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids, attn, mask = _group_rows(model.config.vocab_size)
    padded = ScoredForward(model, model, temperature=0.7)
    ref = padded(ids, attn, mask)
    lp, ent = scored_logprobs(ref.logits, ids, mask, with_entropy=True)
    (lp.sum() + ent.sum()).backward()
    g_padded = _grads(model)
    model.zero_grad()

    shared = ScoredForward(model, model, temperature=0.7, packed=True)
    assert shared.uses_packing() and shared.shares_prefix()
    shapes = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, i, o: shapes.append(tuple(i[0].shape)))
    scored = shared(ids, attn, mask)
    hook.remove()
    assert shapes == [(1, 20 + 6 + 3 + 8 + 11)]
    lp_s, ent_s = scored_logprobs(scored.logits, ids, mask, with_entropy=True)
    (lp_s.sum() + ent_s.sum()).backward()
    assert torch.allclose(lp_s, lp, atol=1e-5) and torch.allclose(ent_s, ent, atol=1e-5)
    assert torch.allclose(scored.hidden[attn.bool()], ref.hidden[attn.bool()].detach(), atol=1e-5)
    assert torch.allclose(_grads(model), g_padded, atol=1e-5)


def test_a_shared_prefix_with_restarted_positions_would_show(tiny_model_dir):
    """The equality above can fail: the same blocks with every member's own tokens at positions from 0 (as if
    it had no prefix) give other logprobs."""
    from transformers import AutoModelForCausalLM

    from sleuth.training.rl.packing import layout, use_segment_attention

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    use_segment_attention(model)
    ids, attn, _ = _group_rows(model.config.vocab_size)
    real = attn.bool()
    row = layout([r[m].tolist() for r, m in zip(ids, real, strict=True)])
    wrong = [p - 20 if 20 <= i < 37 else p for i, p in enumerate(row.positions)]
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=attn).logits[real]
        src = torch.tensor([i for s in row.sources for i in s])
        good, bad = (model(input_ids=torch.tensor(row.ids)[None], position_ids=torch.tensor(pos)[None],
                           use_cache=False, sleuth_blocks=row.blocks).logits[0][src] for pos in (row.positions, wrong))
    assert torch.allclose(good, padded, atol=1e-5)
    assert float((bad - padded).abs().max()) > 1e-3
