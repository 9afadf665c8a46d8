"""TransformersRollout and the whole Trainer on the GPU (tiny and ~0.7B models)."""

from __future__ import annotations

import contextlib
import math
import time
import traceback

from gpucheck.base import REPO, T0, Check, Report, State, _free, _sync, destroy, dev, model_dtype, prompts


def check_rollout(rep: Report, st: State) -> None:
    with Check(rep, "rollout", 60) as c:
        c.check_skip()
        if st.big_dir is None or st.tiny_dir is None:
            raise RuntimeError("no models (the models check failed)")
        import numpy as np

        from sleuth.agents.chat import ChatRenderer
        from sleuth.agents.policies.base import SamplingParams
        from sleuth.agents.policies.models import load_causal_lm
        from sleuth.agents.trajectory import Trajectory, Turn
        from sleuth.training.rl.losses import LossConfig
        from sleuth.training.rl.update import PolicyUpdater, UpdateConfig
        from sleuth.training.rollout.in_process import TransformersRollout, probe_logits
        from sleuth.training.run import PROBE
        from sleuth.training.zero import DeepSpeedConfig, build_engine

        sz = st.sz
        tol = UpdateConfig().sync_tolerance
        c.figures["sync_tolerance"] = tol
        rows = ["| model | batch | new tokens each | s | generated tokens/s |", "|---|---|---|---|---|"]
        rollouts = {}
        for label, path in (("tiny", st.tiny_dir), ("big", st.big_dir)):
            ro = None
            try:
                from transformers import AutoTokenizer

                tok = AutoTokenizer.from_pretrained(path)
                probe_ids = ChatRenderer(tok).prompt_ids(PROBE)
                ro = TransformersRollout(path, str(dev()), model_dtype(), probe_ids, tol,
                                         max_batch=max(sz["gen_batches"]))
                reqs = prompts(tok, max(sz["gen_batches"]), st.tasks_spec)
                ro.policy.generate(reqs[:2], SamplingParams(max_tokens=4, temperature=1.0, seed=0))  # warm-up
                for bs in sz["gen_batches"]:
                    sp = SamplingParams(max_tokens=sz["gen_tokens"], temperature=1.0, seed=1)
                    _sync()
                    t = time.perf_counter()
                    gens = ro.policy.generate(reqs[:bs], sp)
                    _sync()
                    s = time.perf_counter() - t
                    n = sum(len(g.ids) for g in gens)
                    rows.append(f"| {label} | {bs} | {sz['gen_tokens']} | {s:.2f} | {n / s:.0f} |")
                    c.figures[f"{label}_b{bs}_tok_s"] = round(n / s)
                    c.need(all(np.isfinite(g.logprobs).all() for g in gens), f"{label}: non-finite logprobs")
                rollouts[label] = (ro, reqs, gens, probe_ids)
            except Exception as e:  # noqa: BLE001
                c.fail.append(f"{label} generation: {type(e).__name__}: {str(e)[:300]}")
                traceback.print_exc()
            if label == "tiny" and ro is not None:
                del ro
                rollouts.pop("tiny", None)
                _free()
        # An update of the big model on its own generations, then the verified sync into the rollout engine.
        if "big" in rollouts:
            ro, reqs, gens, probe_ids = rollouts["big"]
            model = load_causal_lm(st.big_dir, model_dtype()).to(dev())
            model.config.use_cache = False
            engine = build_engine(model, DeepSpeedConfig(zero_stage=2, lr=sz["lr"] * 10))
            try:
                c.figures["sync_before_update_max_logit_diff"] = _sync_checked(c, ro, engine.module, "before update")
                before = probe_logits(ro.policy.model, probe_ids)
                trajs = [Trajectory(f"r{i}", "DocRead-v0", r.prompt_ids, turns=[Turn(g.ids, g.logprobs, g.text)],
                                    group="g")
                         for i, (r, g) in enumerate(zip(reqs, gens, strict=False))]
                advs = [np.full(t.num_policy_tokens, 1.0 if i % 2 == 0 else -1.0) for i, t in enumerate(trajs)]
                upd = PolicyUpdater(engine, UpdateConfig(micro_batch_tokens=sz["micro_tokens"]), LossConfig(), pad_id=0)
                _sync()
                t = time.perf_counter()
                stats = upd.update(trajs, advs)
                _sync()
                c.figures["update_on_rollouts_s"] = round(time.perf_counter() - t, 3)
                mm = np.asarray(stats.mismatch)
                c.figures["engine_trainer_logprob_mismatch_mean"] = float(mm.mean()) if mm.size else float("nan")
                c.figures["engine_trainer_logprob_mismatch_p99"] = (float(np.percentile(mm, 99)) if mm.size
                                                                     else float("nan"))
                t = time.perf_counter()
                diff = _sync_checked(c, ro, engine.module, "after update")
                _sync()
                c.figures["sync_s"] = round(time.perf_counter() - t, 3)
                c.figures["sync_max_logit_diff"] = diff
                changed = float((probe_logits(ro.policy.model, probe_ids) - before).abs().max())
                c.figures["probe_logit_change_from_update"] = changed
                c.need(changed > 0, "the update did not change the rollout engine's logits")
                c.figures["policy_version"] = ro.policy.version
            finally:
                destroy(engine)
                del engine, model
        c.table = rows


def _sync_checked(c: Check, ro, module, when: str) -> float:
    """TransformersRollout.sync as the trainer calls it; if its verification refuses (WeightSyncError), the
    check fails and the difference is measured anyway (the weights were loaded before the verification)."""
    from sleuth.training.rollout.in_process import WeightSyncError

    try:
        return ro.sync(module)["sync/max_logit_diff"]
    except WeightSyncError as e:
        c.fail.append(f"sync {when}: WeightSyncError: {str(e)[:200]}")
        tol, ro.tolerance = ro.tolerance, float("inf")
        try:
            return ro.verify(module)["sync/max_logit_diff"]
        finally:
            ro.tolerance = tol


def _trainer_run(rep: Report, st: State, c: Check, name: str, model: str, steps: int, stage: int, **kw) -> list[dict]:
    """_trainer_attempt; if the trainer's verified weight sync refuses (bf16 logits off by more than
    update.sync_tolerance), the check fails and the run is repeated with a looser tolerance for the figures."""
    from sleuth.training.rollout.in_process import WeightSyncError

    try:
        return _trainer_attempt(rep, st, c, name, model, steps, stage, **kw)
    except WeightSyncError as e:
        c.fail.append(f"{name}: WeightSyncError: {str(e)[:200]}")
        traceback.print_exc()
        rep.notes.append(f"trainer run {name}: the verified weight sync refused; repeated with "
                         "update.sync_tolerance=0.05 to measure the rest (figures marked _retry)")
        _free()
        return _trainer_attempt(rep, st, c, name + "_retry", model, steps, stage, sync_tolerance=0.05, **kw)


def _trainer_attempt(rep: Report, st: State, c: Check, name: str, model: str, steps: int, stage: int, *,
                     max_tokens: int, group: int, checkpoint: bool, export: bool, tensorboard: bool,
                     base: str = "docread_quick.yaml", sync_tolerance: float | None = None,
                     dtype: str = "auto") -> list[dict]:
    """configs/<base> with `model` (also as the information-gain reader), the given ZeRO stage (bf16 on GPU:
    deepspeed.dtype auto), short turns and an entropy bonus, written to a temporary YAML, run through
    load_config + Trainer."""
    import yaml

    from sleuth.training.config import load_config
    from sleuth.training.rl.trainer import Trainer

    out = st.work / f"train-{name}"
    cfg_path = st.work / f"{name}.yaml"
    data = yaml.safe_load((REPO / "configs" / base).read_text())
    data.update(model=model, out=str(out), max_steps=steps, tasks=st.tasks_spec, task_limit=24,
                tensorboard=tensorboard)
    data["rollout"].update(max_tokens=max_tokens, group_size=group, tasks_per_step=2)
    data["deepspeed"].update(zero_stage=stage, lr=1e-3 if "tiny" in name else 1e-5, dtype=dtype)
    data.setdefault("loss", {})["entropy_coef"] = 0.01  # a random model earns no reward: entropy moves weights
    data["checkpoint"] = {"every": 1 if checkpoint else 0, "keep": 2, "export_hf": export}
    est_args = data.get("algorithm", {}).get("estimator_args") or {}
    if "reader" in est_args:  # info_gain: the reader is the policy's model, refreshed from it every step
        est_args.update(reader=model, refresh_every=1)
    if sync_tolerance is not None:
        data.setdefault("update", {})["sync_tolerance"] = sync_tolerance
    cfg_path.write_text(yaml.safe_dump(data, sort_keys=False))
    cfg = load_config(cfg_path)
    t = time.perf_counter()
    trainer = Trainer(cfg, progress=False)
    c.figures[f"{name}_init_s"] = round(time.perf_counter() - t, 2)
    if not checkpoint:  # the trainer saves at the last step regardless: skip it (GBs of optimizer state)
        trainer.save = lambda: None
    t = time.perf_counter()
    rows = trainer.train()
    c.figures[f"{name}_train_s"] = round(time.perf_counter() - t, 2)
    c.keys = (c.keys or []) + [f"{name}_init_s", f"{name}_train_s"]
    tol = cfg.update.sync_tolerance
    for i, r in enumerate(rows):
        k = f"{name}_step{i + 1}"
        for key in ("time/rollout", "time/reward", "time/update", "time/sync"):
            c.figures[f"{k}_{key.split('/')[1]}_s"] = round(r[key], 3)
        c.figures[f"{k}_rollout_tok_s"] = round(r["tokens_per_s/rollout"])
        c.figures[f"{k}_update_tok_s"] = round(r["tokens_per_s/update"])
        c.figures[f"{k}_mismatch_mean"] = r.get("mismatch/mean")
        c.figures[f"{k}_sync_diff"] = r.get("sync/max_logit_diff")
        c.figures[f"{k}_grad_norm"] = r.get("grad_norm")
        c.need(math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0, f"{k}: grad norm {r['grad_norm']}")
        diff = r.get("sync/max_logit_diff", 0.0)  # absent where the engine runs the trainer's own module
        c.need(diff <= tol, f"{k}: sync diff {diff}")
        c.need(math.isfinite(r["loss/policy"]), f"{k}: loss {r['loss/policy']}")
    c.need([r["policy_version"] for r in rows] == list(range(1, steps + 1)), f"{name}: policy versions")
    c.table += [f"| {name} | {i + 1} | {r['time/rollout']:.2f} | {r['time/reward']:.3f} | {r['time/update']:.2f} | "
                f"{r['time/sync']:.2f} | {r['tokens_per_s/rollout']:.0f} | {r['tokens_per_s/update']:.0f} | "
                f"{r['mismatch/mean']:.2e} | {r.get('sync/max_logit_diff', float('nan')):.2e} |"
                for i, r in enumerate(rows)]
    if checkpoint:
        c.need((out / "checkpoints" / "latest").exists(), f"{name}: no checkpoint")
    if tensorboard:
        c.need(bool(list((out / "tensorboard").glob("events.out.tfevents.*"))), f"{name}: no TensorBoard events")
    if export:
        import torch

        from sleuth.agents.policies.models import load_causal_lm
        from sleuth.training.rollout.in_process import probe_logits

        hf = load_causal_lm(out / "hf", model_dtype()).to(dev()).eval()
        diff = float((probe_logits(hf, trainer.probe_ids) - probe_logits(trainer.engine.module, trainer.probe_ids))
                     .abs().max())
        c.figures[f"{name}_exported_hf_probe_diff"] = diff
        c.keys.append(f"{name}_exported_hf_probe_diff")
        c.need(diff <= 1e-2, f"{name}: exported model differs from the trained one by {diff}")
        del hf
        with contextlib.suppress(Exception):
            torch.cuda.empty_cache()
    destroy(trainer.engine)
    del trainer
    _free()
    return rows


TRAINER_TABLE = ["| run | step | rollout s | reward s | update s | sync s | rollout tok/s | update tok/s | "
                 "mismatch mean | sync diff |", "|---|---|---|---|---|---|---|---|---|---|"]


def _trainer_check(rep: Report, st: State, check: str, runs: list[tuple], est: float) -> None:
    with Check(rep, check, est) as c:
        c.check_skip()
        sz = st.sz
        c.table = list(TRAINER_TABLE)
        for i, (name, model, steps, stage, kw, need_s) in enumerate(runs):
            left = st.args.budget_s - (time.time() - T0)
            if model is None or left < need_s:
                c.figures[f"{name}"] = f"skipped ({'no model' if model is None else f'{left:.0f} s left'})"
                c.keys = (c.keys or []) + [name]
                if i == 0:
                    c.fail.append(f"{name} skipped")
                continue
            try:
                tokens = sz["big_trainer_tokens"] if name.startswith("big") else sz["trainer_max_tokens"]
                _trainer_run(rep, st, c, name, model, steps, stage, max_tokens=tokens, group=sz["trainer_group"], **kw)
            except Exception as e:  # noqa: BLE001
                c.fail.append(f"{name}: {type(e).__name__}: {str(e)[:300]}")
                traceback.print_exc()
            _free()


def check_trainer(rep: Report, st: State) -> None:
    """The whole Trainer with the tiny model: configs/docread_quick.yaml for 2 steps on ZeRO-2 (checkpoints,
    TensorBoard, HF export loaded back and compared), 1 step on ZeRO-3 (ZeRO-3 gathers for sync and export);
    configs/docread_cigpo.yaml (information gain: the reader on the GPU, refreshed from the policy) 1 step."""
    _trainer_check(rep, st, "trainer", [
        ("tiny_zero2", st.tiny_dir, 2, 2, dict(checkpoint=True, export=True, tensorboard=True), 40),
        ("tiny_zero3", st.tiny_dir, 1, 3, dict(checkpoint=True, export=True, tensorboard=False), 25),
        ("tiny_cigpo", st.tiny_dir, 1, 2, dict(checkpoint=False, export=False, tensorboard=False,
                                               base="docread_cigpo.yaml"), 25)], 40)


def check_trainer_big(rep: Report, st: State) -> None:
    """One Trainer step with the ~0.7B model on ZeRO-2 (no checkpoint): per-stage timings at a real size, in
    bf16 and in fp32 (rollout engine and trainer alike): what the engine–trainer mismatch costs to remove."""
    _trainer_check(rep, st, "trainer_big", [
        ("big_zero2", st.big_dir, 1, 2, dict(checkpoint=False, export=False, tensorboard=False), 45),
        ("big_zero2_fp32", st.big_dir, 1, 2,
         dict(checkpoint=False, export=False, tensorboard=False, dtype="fp32"), 45)],
        90)


