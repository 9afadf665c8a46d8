"""GPU checks of sleuth's training paths, in one process, under a hard time budget; prints figures.

Run on a CUDA machine (bf16 + NCCL):   python experiments/gpu_check.py [--budget-s 300]
Run here, tiny and fast (fp32 + gloo): python experiments/gpu_check.py --cpu-smoke

Checks, in this order (each PASS / FAIL / SKIP with figures; a failure never stops the others):
  env          GPU, torch / CUDA / NCCL versions, bf16 support, nvidia-smi, a bf16 matmul rate
  imports      sleuth, sleuth.envs (DocRead through gymnasium), sleuth.agents, sleuth.training.*, deepspeed,
               datasets (import times); HotpotQA tasks through the project's loader; one DocRead step
  models       the tiny model (sleuth.agents.policies.models.tiny_model) and a random ~0.7B model of the same
               architecture (SmolLM2 config + tokenizer from $SLEUTH_DATA/smollm2-tok; no weights travel)
  nccl         the process group the project opens (init_distributed) and the collectives PolicyUpdater
               runs (update.all_sum / all_max), all_gather_object, barrier, a device all_reduce
  trainer      the whole Trainer on DocRead (text harness, GRPO) with the tiny model: 2 steps on ZeRO-2
               (checkpoints, TensorBoard, HF export loaded back and compared), 1 step on ZeRO-3
  ray          `sleuth train` on Ray (SKIP without ray): 3 steps of configs/docread_quick.yaml with the tiny
               model, one TrainRank and one RolloutWorker actor (0.5 GPU each), the worker SIGKILLed from
               outside after step 1: rc 0, cluster/restarts >= 1, every sync within update.sync_tolerance;
               s per stage
  ray_collective  the same with update.sync_transport=collective (gloo: the two share one GPU): MB/s per sync
  ray_vllm     the same with rollout.inference=vllm (a supervised vLLM server as the worker, logprobs verified);
               SKIP in one line where no vLLM Python is installed
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
import os
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

from gpucheck.base import REPO, T0, Report, State
from gpucheck.basic import check_env, check_faiss, check_imports, check_models, check_nccl, check_vllm
from gpucheck.ray_path import check_ray, check_ray_collective, check_ray_vllm
from gpucheck.training import check_rollout, check_trainer, check_trainer_big
from gpucheck.update import check_update

CHECKS = {"env": check_env, "imports": check_imports, "models": check_models, "nccl": check_nccl,
          "trainer": check_trainer, "ray": check_ray, "ray_collective": check_ray_collective,
          "ray_vllm": check_ray_vllm, "rollout": check_rollout, "update": check_update,
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
        print("!!! torch sees no CUDA device: running the CPU smoke sizes instead (the env check will FAIL)",
              flush=True)
        args.cpu_smoke = args.no_cuda_fallback = True
    if args.budget_s is None:
        args.budget_s = 600.0 if args.cpu_smoke else 300.0
    if args.tokenizer_dir is None:
        cand = Path(os.environ.get("SLEUTH_DATA", "")) / "smollm2-tok"
        if os.environ.get("SLEUTH_DATA") and (cand / "tokenizer.json").exists():
            args.tokenizer_dir = str(cand)
        else:
            from sleuth.agents.policies.models import embedded_model_dir

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
