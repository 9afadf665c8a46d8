"""Environment, imports, models, NCCL, faiss and vLLM checks."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import time
import traceback
from pathlib import Path
from typing import Any

from gpucheck.base import FAISS_NOT_CARRIED, VLLM_NOT_CARRIED, Check, Report, State, _quiet, dev, model_dtype


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
                    "sleuth.agents", "sleuth.agents.policies.hf", "sleuth.rewards", "sleuth.training.zero",
                    "sleuth.training.rl.update", "sleuth.training.rollout.in_process", "sleuth.training.rl.trainer"):
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
    """The tiny model (sleuth.agents.policies.models.tiny_model, SmolLM2 tokenizer) and a bigger random model of the
    same architecture, saved as HF directories (no weights travel: they are made here)."""
    with Check(rep, "models", 25) as c:
        c.check_skip()
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        from sleuth.agents.policies.models import tiny_model

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

        from sleuth.training.rl import update as upd
        from sleuth.training.zero import init_distributed

        rank, world = init_distributed()
        c.figures["backend"] = str(dist.get_backend())
        c.figures["world"] = world
        # What PolicyUpdater.update calls before any forward: all_sum / all_max of Python floats.
        for name, fn in (("all_sum", upd.all_sum), ("all_max", upd.all_max)):
            try:
                c.figures[f"{name}_as_is"] = fn(3.0)
            except Exception as e:  # noqa: BLE001
                c.figures[f"{name}_as_is"] = f"{type(e).__name__}"
                c.fail.append(f"sleuth.training.rl.update.{name} on this backend: {type(e).__name__}: {str(e)[:200]}")
        # What the trainer and checkpoints use besides: all_gather_object, barrier, a device all_reduce.
        out: list[Any] = [None] * world
        dist.all_gather_object(out, {"rank": rank})
        c.figures["all_gather_object"] = out == [{"rank": r} for r in range(world)]
        dist.barrier()
        t = torch.ones(4, device=dev())
        dist.all_reduce(t)
        c.figures["device_all_reduce"] = float(t[0])
        c.need(c.figures["all_gather_object"] and c.figures["device_all_reduce"] == world, "collectives")



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


