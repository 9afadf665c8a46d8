"""One policy update of the ~0.7B model: plain torch AdamW vs sleuth's PolicyUpdater on ZeRO-2/3."""

from __future__ import annotations

import contextlib
import math
import time
import traceback
from typing import Any

from gpucheck.base import (
    T0,
    Check,
    Report,
    State,
    _free,
    _peak_gib,
    _peak_reset,
    _sync,
    destroy,
    dev,
    model_dtype,
    surrogate,
    synthetic_batch,
)


def check_update(rep: Report, st: State) -> None:
    with Check(rep, "update", 110) as c:
        c.check_skip()
        if st.big_dir is None:
            raise RuntimeError("no big model (the models check failed)")
        import torch

        from sleuth.agents.policies.models import load_causal_lm
        from sleuth.training.rl.batch import micro_batches
        from sleuth.training.rl.losses import LossConfig, denominator, policy_loss, token_logprobs
        from sleuth.training.rl.update import PolicyUpdater, UpdateConfig
        from sleuth.training.zero import DeepSpeedConfig, build_engine

        sz = st.sz
        d = dev()
        cuda = torch.cuda.is_available()
        trajs, advs = synthetic_batch(sz["n_seqs"], sz["seq_len"], 49152 - 10, seed=1)
        n_tok = sum(len(t.token_ids()) for t in trajs)
        n_pol = sum(t.num_policy_tokens for t in trajs)
        lc = LossConfig(entropy_coef=0.0)
        mbt = sz["micro_tokens"]
        c.figures.update(seqs=len(trajs), tokens=n_tok, policy_tokens=n_pol, micro_batch_tokens=mbt,
                         micro_batches=len(micro_batches(trajs, advs, 0, mbt)), params_M=round(st.big_params / 1e6, 1))
        rows = ["| update | s/update | trained tokens/s | peak GiB (above start) | objective before → after | loss | "
                "grad norm | ratio vs DS ZeRO-2 | load+init s |", "|---|---|---|---|---|---|---|---|---|"]
        results: dict[str, dict[str, Any]] = {}

        def plain(mode: str):
            """The same loss over the same micro-batches, a plain torch loop: forward, backward, clip, AdamW."""
            dtype = torch.float32 if mode == "torch_fp32w_autocast" else model_dtype()
            model = load_causal_lm(st.big_dir, dtype).to(d)
            model.config.use_cache = False
            fused = {"fused": True} if cuda else {}
            opt = torch.optim.AdamW(model.parameters(), lr=sz["lr"], betas=(0.9, 0.999), weight_decay=0.0, **fused)
            auto = cuda and mode == "torch_fp32w_autocast"

            def step() -> dict[str, float]:
                model.train()
                batches = micro_batches(trajs, advs, 0, mbt)
                denom = sum(denominator(b.loss_mask, lc.aggregation) for b in batches)
                loss = 0.0
                for b in batches:
                    b = b.to(d)
                    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if auto else contextlib.nullcontext()
                    with ctx:
                        logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
                    logp, ent = token_logprobs(logits, b.input_ids, b.loss_mask, with_entropy=True)
                    terms, _ = policy_loss(lc, logp, logp.detach(), b.advantages, b.loss_mask, None, ent)
                    (terms.total / denom).backward()
                    loss += float(terms.total.detach()) / denom
                gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
                return {"loss": loss, "grad_norm": float(gn)}

            return model, step, auto, None

        def ds(stage: int):
            model = load_causal_lm(st.big_dir, model_dtype()).to(d)
            model.config.use_cache = False
            engine = build_engine(model, DeepSpeedConfig(zero_stage=stage, lr=sz["lr"]))
            upd = PolicyUpdater(engine, UpdateConfig(micro_batch_tokens=mbt), lc, pad_id=0)

            def step() -> dict[str, float]:
                s = upd.update(trajs, advs)
                loss = s.loss_policy + s.loss_kl + s.loss_entropy + s.loss_mix if s.optimizer_steps else float("nan")
                return {"loss": loss, "grad_norm": s.grad_norm, "train_tokens": s.train_tokens}

            return engine.module, step, False, engine

        modes = [("torch_bf16", lambda: plain("torch_bf16")),
                 ("torch_fp32w_autocast", lambda: plain("torch_fp32w_autocast")),
                 ("deepspeed_zero2", lambda: ds(2)), ("deepspeed_zero3", lambda: ds(3))]
        if not cuda:
            modes = [m for m in modes if m[0] != "torch_bf16"]  # fp32 on CPU: the autocast variant is the plain one
        for name, make in modes:
            left = st.args.budget_s - (time.time() - T0)
            if left < 25:
                c.fail.append(f"{name}: skipped, {left:.0f} s of budget left")
                continue
            try:
                _free()
                _peak_reset()
                base_gib = torch.cuda.memory_allocated() / 2**30 if cuda else float("nan")
                t = time.perf_counter()
                module, step, auto, engine = make()
                init_s = time.perf_counter() - t
                before = surrogate(module, trajs, advs, mbt, autocast=auto)
                _sync()
                stats = step()  # warm-up (also the first optimizer step: allocates the Adam states)
                _sync()
                times, losses, gns = [], [stats["loss"]], [stats["grad_norm"]]
                for _ in range(sz["timed"]):
                    _sync()
                    t = time.perf_counter()
                    stats = step()
                    _sync()
                    times.append(time.perf_counter() - t)
                    losses.append(stats["loss"])
                    gns.append(stats["grad_norm"])
                after = surrogate(module, trajs, advs, mbt, autocast=auto)
                s = sorted(times)[len(times) // 2]
                r = {"init_s": init_s, "s_per_update": s, "tokens_per_s": n_tok / s,
                     "peak_gib": _peak_gib() - base_gib, "allocated_before_gib": base_gib,
                     "objective_before": before, "objective_after": after, "loss": losses, "grad_norm": gns,
                     "finite": all(math.isfinite(x) for x in [*losses, *gns, before, after])}
                results[name] = r
                c.need(r["finite"], f"{name}: non-finite loss/grad norm/objective")
                if name == "torch_bf16":  # pure bf16 weights can round small AdamW steps away: a figure, not a check
                    c.figures["torch_bf16_objective_change"] = after - before
                else:
                    c.need(after > before, f"{name}: objective did not increase ({before:.4f} → {after:.4f})")
                c.need(all(g > 0 for g in gns), f"{name}: zero grad norm")
                print(f"    {name}: init {init_s:.1f} s, {s:.3f} s/update, {n_tok / s:.0f} tokens/s, peak "
                      f"{r['peak_gib']:.1f} GiB, objective {before:.4f} → {after:.4f}, "
                      f"loss {losses}, grad norm {gns}",
                      flush=True)
                del module, step
                if engine is not None:
                    destroy(engine)
                del engine
            except Exception as e:  # noqa: BLE001
                c.fail.append(f"{name}: {type(e).__name__}: {str(e)[:300]}")
                traceback.print_exc()
            _free()
        base = results.get("deepspeed_zero2", {}).get("s_per_update")
        for name, r in results.items():
            ratio = f"{r['s_per_update'] / base:.2f}" if base else "-"
            rows.append(f"| {name} | {r['s_per_update']:.3f} | {r['tokens_per_s']:.0f} | {r['peak_gib']:.1f} | "
                        f"{r['objective_before']:.4f} → {r['objective_after']:.4f} | {r['loss'][-1]:.4f} | "
                        f"{r['grad_norm'][-1]:.3g} | {ratio} | {r['init_s']:.1f} |")
            c.figures[f"{name}_s"] = round(r["s_per_update"], 4)
            c.figures[f"{name}_tok_s"] = round(r["tokens_per_s"])
            c.figures[f"{name}_peak_gib"] = round(r["peak_gib"], 2)
        for a, b in (("deepspeed_zero2", "torch_bf16"), ("deepspeed_zero2", "torch_fp32w_autocast"),
                     ("deepspeed_zero3", "deepspeed_zero2")):
            if a in results and b in results:
                c.figures[f"time_{a}_over_{b}"] = round(results[a]["s_per_update"] / results[b]["s_per_update"], 3)
        c.table = rows + ["", f"Batch: {len(trajs)} synthetic trajectories, {n_tok} tokens ({n_pol} policy tokens), "
                          f"micro-batches of ≤ {mbt} padded tokens; model {st.big_params / 1e6:.1f}M params, "
                          f"lr {sz['lr']}, median of {sz['timed']} timed updates "
                          f"after one warm-up"]
        c.figures["detail"] = results
        c.keys = ["params_M", "tokens", "policy_tokens"] + [k for k in c.figures
                                                            if k.endswith(("_s", "_tok_s", "_peak_gib"))
                                                            or k.startswith("time_")]


