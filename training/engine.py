"""The DeepSpeed ZeRO engine: process group, config, optimizer, optional LoRA.

One code path for every stage (0/1/2/3), CPU or GPU: bf16 + NCCL on GPU, fp32 + gloo on CPU. Gradient
accumulation is *unmanaged* (`managed_gradient_accumulation: false`): the trainer calls `backward` once
per micro-batch and `step` once per update, so the number of micro-batches may change from step to step
(dropped zero-variance groups, dynamic sampling) without reconfiguring the engine."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from sleuth.net import free_port


@dataclass
class LoraConfig:
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


@dataclass
class EngineConfig:
    zero_stage: int = 2
    offload: bool = False  # optimizer states to CPU (stage ≥ 1); parameters too at stage 3
    dtype: str = "auto"  # auto = bf16 on GPU, fp32 on CPU | fp32 | bf16
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
            raise ValueError(f"engine.zero_stage must be 0, 1, 2 or 3; got {self.zero_stage}")
        if self.dtype not in ("auto", "fp32", "bf16"):
            raise ValueError(f"engine.dtype must be auto, fp32 or bf16; got {self.dtype!r}")
        if self.optimizer not in ("adamw", "cpu_adam"):
            raise ValueError(f"engine.optimizer must be adamw or cpu_adam; got {self.optimizer!r}")
        if self.offload and self.zero_stage == 0:
            raise ValueError("engine.offload needs zero_stage ≥ 1")
        self.betas = tuple(self.betas)  # type: ignore[assignment]


DIST_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def init_distributed() -> tuple[int, int]:
    """Join (or, in a plain `python` process, create) the process group; returns (rank, world size).
    torchrun and the deepspeed launcher set RANK/WORLD_SIZE; a lone process gets a world of one instead of
    DeepSpeed's search for MPI."""
    import deepspeed

    if "RANK" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT", str(free_port())))
    if os.environ["WORLD_SIZE"] == "1":
        # DeepSpeed's CPU backend JIT-compiles a shared-memory all-reduce op at start-up (~45 s of g++ on a
        # machine whose extension cache is cold): a world of one reduces nothing, so mark it unavailable.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def resolved_dtype(cfg: EngineConfig) -> torch.dtype:
    if cfg.dtype == "auto":
        return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32
    return torch.bfloat16 if cfg.dtype == "bf16" else torch.float32


def deepspeed_config(cfg: EngineConfig) -> dict[str, Any]:
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
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": resolved_dtype(cfg) == torch.bfloat16},
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,  # torch AdamW with offload: no C++ build needed
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def build_engine(model: torch.nn.Module, cfg: EngineConfig) -> Any:
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
    if cfg.optimizer == "cpu_adam":
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        opt = DeepSpeedCPUAdam(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, adamw_mode=True)
    else:
        # fused: one kernel over all parameters, on the CPU as on CUDA (torch's default there is a Python loop
        # over tensors: 1-2 s per step for SmolLM2's 135M parameters on 2 cores, fused 0.07 s; HF Trainer's
        # default `adamw_torch_fused` is the same kernel).
        opt = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, fused=True)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=deepspeed_config(cfg))
    return engine


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


def full_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The plain (merged, un-prefixed) weights of the trained model, as the base architecture names them:
    what a rollout engine or `save_pretrained` needs. Call on every rank (ZeRO-3 gathers collectively)."""
    with full_parameters(module):
        if hasattr(module, "merge_adapter"):  # peft: fold LoRA into the base weights for the copy only
            module.merge_adapter()
            try:
                base = module.get_base_model()
                sd = {k.replace(".base_layer", ""): v.detach().clone() for k, v in base.state_dict().items()
                      if "lora_" not in k}
            finally:
                module.unmerge_adapter()
            return sd
        return {k: v.detach().clone() for k, v in module.state_dict().items()}
