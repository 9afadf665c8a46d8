"""What `sleuth train` and `sleuth sft` set up alike: the run directory (one process group owns it; a new
run never overwrites another's checkpoints; `--resume` continues the newest complete one; its config and
metrics), and the policy model on its DeepSpeed engine with its tokenizer."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sleuth.core.errors import ConfigError
from sleuth.tasks.base import Task
from sleuth.training import checkpoint
from sleuth.training.config import TrainConfig
from sleuth.training.metrics import MetricsLogger, WandbConfig
from sleuth.training.zero import DeepSpeedConfig, build_engine, device, for_engines, load_dtype, resolved_dtype

# The prompt of the weight-sync check: the rollout engine's logits on it must match the trainer's.
PROBE = [{"role": "user", "content": "Which city is the capital of France? Answer in one word."}]


class RunDir:
    """A run's output directory, held for the run's whole life (rank 0 holds its lock; every rank raises when
    another process holds it)."""

    def __init__(self, out: str | Path, resume: bool):
        self.path = Path(out)
        self.checkpoints = self.path / "checkpoints"
        self.resuming = resume
        self.lock = checkpoint.own_run_dir(self.path)
        if not resume and checkpoint.has_run(self.checkpoints):
            self.release()
            raise ConfigError(f"{self.path} already holds a run; pass --resume to continue it or choose another --out")

    def restore(self, engine: Any) -> dict[str, Any] | None:
        """The trainer state of the newest complete checkpoint, loaded into `engine` (None on a fresh run)."""
        return checkpoint.resume(engine, self.checkpoints, self.path) if self.resuming else None

    def save(self, engine: Any, step: int, state: dict[str, Any], keep: int) -> None:
        checkpoint.save(engine, self.checkpoints, step, state, keep)

    def open(self, rank: int, step: int, config: Any, tensorboard: bool, wandb: WandbConfig) -> MetricsLogger | None:
        """Rank 0 writes `config.yaml` and returns the metrics logger (JSONL, TensorBoard, W&B), continuing
        after `step`; other ranks log nothing."""
        if rank != 0:
            return None
        import yaml

        from sleuth.training.typed_yaml import to_dict

        data = json.loads(json.dumps(to_dict(config), default=list))  # tuples and paths as YAML can read them
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
        return MetricsLogger(self.path, step, tensorboard, wandb, data)

    def release(self) -> None:
        """Let another process have the run directory."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None


@dataclass
class PolicyModel:
    """The policy being trained: its weights on the DeepSpeed engine, the tokenizer, and the path they came
    from (a rollout engine or a reference model loads the same)."""

    path: str
    tokenizer: Any
    pad_id: int
    dtype: torch.dtype  # what the engine, and every rollout engine of the run, computes in (`resolved_dtype`)
    engine: Any
    hidden_size: int


def load_policy_model(model: str, engine_cfg: DeepSpeedConfig, vllm_rollout: bool = False) -> PolicyModel:
    """`model` (a name such as `smollm2`, a Hugging Face id or a directory) on an engine built from `engine:`, in the
    dtype every engine of the run computes in (`vllm_rollout`: its rollout engines are vLLM; `resolved_dtype`)."""
    from transformers import AutoTokenizer

    from sleuth.agents.policies.models import load_causal_lm, resolve_model

    path = str(resolve_model(model))
    tokenizer = AutoTokenizer.from_pretrained(path)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    engine_cfg = for_engines(engine_cfg, vllm_rollout)
    net = load_causal_lm(path, load_dtype(engine_cfg)).to(device())
    net.config.use_cache = False
    return PolicyModel(path, tokenizer, pad_id, resolved_dtype(engine_cfg), build_engine(net, engine_cfg),
                       net.config.hidden_size)


def load_reference(policy: PolicyModel) -> torch.nn.Module:
    """The frozen reference model of a KL term: the policy's starting weights, in its compute dtype."""
    from sleuth.agents.policies.models import load_causal_lm

    ref = load_causal_lm(policy.path, policy.dtype).to(device()).eval()
    return ref.requires_grad_(False)


def training_tasks(cfg: TrainConfig) -> list[Task]:
    """`tasks`, checked against the evaluation data: the source's test split and the run's eval tasks (an env
    whose seeds are rows of its own task set has no test range of seeds: its held-out rows are the eval tasks)."""
    from sleuth.envs.families import family_of
    from sleuth.tasks import LeakageError, check_tasks, held_out_specs, load_held_out, load_tasks

    tasks = load_tasks(cfg.tasks, limit=cfg.task_limit)
    family = family_of(cfg.env)
    try:
        specs = [cfg.eval.tasks] if family is not None and family.rows else held_out_specs(cfg.tasks, [cfg.eval.tasks])
        check_tasks(tasks, load_held_out([s for s in specs if s]), f"tasks {cfg.tasks}")
    except LeakageError as e:
        raise ConfigError(str(e)) from None
    return tasks
