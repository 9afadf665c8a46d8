"""The engine's dtype: `deepspeed.dtype: auto` settles once per run from the machine (bf16 where it is fast and no
vLLM engine must match), and a bf16 engine trains fp32 masters started from the exact weights."""

import pytest
import torch
from train_helpers import seeded_engine

from sleuth.training.zero import DeepSpeedConfig, cpu_bf16_is_fast


@pytest.mark.parametrize("stage", [0, 2])
def test_bf16_engine_updates_fp32_masters_started_from_the_exact_weights(tiny_model_dir, stage, tmp_path):
    """deepspeed.dtype bf16 (what `auto` picks on a CPU with AMX-BF16): the module computes in bf16, AdamW updates
    fp32 masters that start from the checkpoint's exact fp32 weights (not their bf16 rounding). With a
    constant gradient AdamW moves every weight by lr a step (m̂/√v̂ = 1): after k steps the masters hold
    w0 − k·lr·sign g and the module bf16 of that, by hand, and the HF export holds the masters. lr 1e-5 is
    below half a bf16 step of most weights: from bf16-rounded masters few would move at all."""
    from sleuth.training.checkpoint import export_hf
    from sleuth.training.zero import fp32_masters

    lr, k = 1e-5, 6
    engine = seeded_engine(tiny_model_dir, zero_stage=stage, lr=lr, grad_clip=0.0, dtype="bf16")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    w0 = {n: p.detach() for n, p in AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters()}
    params = dict(engine.module.named_parameters())
    assert {p.dtype for p in params.values()} == {torch.bfloat16}
    assert any((w0[n].to(torch.bfloat16).float() != w0[n]).any() for n in params)  # the rounding is real here
    for n, m in fp32_masters(engine).items():
        assert torch.equal(m, w0[n]), n
    torch.manual_seed(1)
    signs = {n: torch.randint(0, 2, p.shape).float() * 2 - 1 for n, p in params.items()}
    for _ in range(k):
        loss = sum((p.float() * signs[n]).sum() for n, p in engine.module.named_parameters())
        engine.backward(loss)
        engine.step()
    masters = fp32_masters(engine)
    moved = total = 0
    for n, p in engine.module.named_parameters():
        expected = w0[n] - k * lr * signs[n]
        torch.testing.assert_close(masters[n], expected, rtol=1e-6, atol=1e-7)
        assert torch.equal(p.detach(), masters[n].to(torch.bfloat16)), n
        moved += int((p.detach() != w0[n].to(torch.bfloat16)).sum())
        total += p.numel()
    assert moved / total > 0.05  # 6e-5 crossed a rounding boundary of a share of the weights
    out = export_hf(engine, tiny_model_dir, tmp_path / "hf", AutoTokenizer.from_pretrained(tiny_model_dir))
    exported = dict(AutoModelForCausalLM.from_pretrained(out).named_parameters())
    for n in params:
        assert torch.equal(exported[n].detach(), masters[n]), n


CPU_KINDS = {  # what torch.cpu.get_capabilities() reports on each kind (the flags that matter)
    "AMX-BF16": {"amx_bf16": True, "amx_tile": True, "avx512_bf16": True, "avx512_f": True, "avx2": True},
    "AVX-512 with AVX512-BF16, no AMX": {"amx_bf16": False, "avx512_bf16": True, "avx512_f": True, "avx2": True},
    "AVX-512": {"avx512_f": True, "avx2": True},
    "AVX2": {"avx2": True},
}


@pytest.mark.parametrize("kind", CPU_KINDS)
def test_auto_dtype_is_one_every_engine_of_the_run_computes_in_on_each_cpu_kind(kind):
    """bf16 only on AMX and only without vLLM engines; the vLLM servers get the trainer's dtype whatever it is."""
    from sleuth.training.rollout.vllm_servers import vllm_command
    from sleuth.training.zero import auto_dtype

    amx = cpu_bf16_is_fast(CPU_KINDS[kind])
    assert amx is (kind == "AMX-BF16")
    assert auto_dtype(None, amx, vllm=False) == (torch.bfloat16 if amx else torch.float32)
    assert auto_dtype(None, amx, vllm=True) == torch.float32
    for dtype in (auto_dtype(None, amx, vllm=True), torch.bfloat16, torch.float32):  # auto, or explicitly set
        cmd = vllm_command("python", "model", 8000, dtype)
        assert cmd[cmd.index("--dtype") + 1] == str(dtype).removeprefix("torch.")


@pytest.mark.parametrize("gpu_bf16", [True, False])
def test_auto_dtype_on_a_gpu_is_the_gpus_whatever_the_cpu(gpu_bf16):
    from sleuth.training.zero import auto_dtype

    for amx in (True, False):
        assert auto_dtype(gpu_bf16, amx, vllm=False) == (torch.bfloat16 if gpu_bf16 else torch.float32)
        assert auto_dtype(gpu_bf16, amx, vllm=True) == torch.float32


def test_the_cpu_read_is_this_machines_and_a_run_settles_auto_once(monkeypatch):
    from sleuth.training import zero as eng

    flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    assert cpu_bf16_is_fast() is ("amx_bf16" in flags)  # the real read (conftest pins the module's to fp32)
    if torch.cuda.is_available():
        return  # the GPU decides there (above)
    monkeypatch.setattr(eng, "cpu_bf16_is_fast", lambda: True)  # as on an AMX CPU
    assert eng.for_engines(DeepSpeedConfig(), vllm=False).dtype == "bf16"
    assert eng.for_engines(DeepSpeedConfig(), vllm=True).dtype == "fp32"
    assert eng.for_engines(DeepSpeedConfig(dtype="bf16"), vllm=True).dtype == "bf16"  # an explicit dtype is kept
    assert eng.resolved_dtype(DeepSpeedConfig(dtype="fp32")) == torch.float32
    monkeypatch.setattr(eng, "cpu_bf16_is_fast", lambda: False)
    assert eng.for_engines(DeepSpeedConfig(), vllm=False).dtype == "fp32"
    assert eng.resolved_dtype(DeepSpeedConfig(dtype="bf16")) == torch.bfloat16
