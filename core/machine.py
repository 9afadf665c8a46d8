"""The machine a figure was measured on, named the same way by benchmarks, experiments and `sleuth doctor`."""

from __future__ import annotations

from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name, the SIMD features that decide fp32 vs bf16, and torch's threads."""
    import torch

    info = Path("/proc/cpuinfo")
    model = next((x.split(":", 1)[1].strip() for x in info.read_text().splitlines() if x.startswith("model name")),
                 "unknown CPU") if info.exists() else "unknown CPU"
    caps = torch.cpu.get_capabilities()
    feats = [f for f in ("amx_bf16", "avx512_bf16", "avx512_f", "avx2") if caps.get(f)]
    return f"{model} ({', '.join(feats) or 'no AVX2'}), {torch.get_num_threads()} threads"
