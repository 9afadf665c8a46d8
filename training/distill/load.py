"""Which teacher `algorithm.distill.teacher` names, loaded beside the student: a model in this process
(`teacher.Teacher`), the policy itself (`self`), or a server (`teacher_server.ServerTeacher`); refused in one
line where it cannot be loaded or reached, or where its vocabulary is not the student's."""

from __future__ import annotations

from typing import Any

import torch

from sleuth.core.errors import ConfigError
from sleuth.training.distill.server_teacher import ServerTeacher
from sleuth.training.distill.signal import DistillConfig
from sleuth.training.distill.teacher import Teacher, TeacherScorer
from sleuth.training.rl.forward import ScoredForward
from sleuth.training.zero import device


def load_teacher(cfg: DistillConfig, policy: Any, packing: bool, chunk: int,
                 micro_batch_tokens: int) -> TeacherScorer:
    """The teacher of `cfg` beside the student `policy` (a `run.PolicyModel`): in this process, or a server
    (`teacher: http://…`); a teacher that cannot be loaded or reached, or one with another vocabulary, is
    refused in one line."""
    from transformers import AutoTokenizer

    from sleuth.agents.policies.models import ModelNotFoundError, load_causal_lm, resolve_model

    temperature = cfg.teacher_temperature
    if cfg.is_server:
        return ServerTeacher(cfg, policy.tokenizer, policy.path)
    if cfg.teacher == "self":
        module = policy.engine.module
        forward = ScoredForward(policy.engine, module, temperature, packed=packing, chunk=chunk)
        return Teacher(cfg, forward, policy.tokenizer, policy.pad_id, _window(module), micro_batch_tokens)
    try:
        path = resolve_model(cfg.teacher)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (ModelNotFoundError, OSError, ValueError) as e:
        raise ConfigError(f"algorithm.distill.teacher {cfg.teacher!r} cannot be loaded: "
                          f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    check_vocabulary(tokenizer, policy.tokenizer, cfg.teacher, policy.path)
    dtype = {"auto": policy.dtype, "float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.teacher_dtype]
    on = torch.device("cpu") if cfg.teacher_device == "cpu" else device()
    try:
        module = load_causal_lm(path, dtype).to(on).eval().requires_grad_(False)
    except (OSError, ValueError) as e:
        raise ConfigError(f"algorithm.distill.teacher {cfg.teacher!r} cannot be loaded: "
                          f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    forward = ScoredForward(module, module, temperature, packed=packing, chunk=chunk)
    return Teacher(cfg, forward, tokenizer, policy.pad_id, _window(module), micro_batch_tokens, on=on)


def check_vocabulary(teacher: Any, student: Any, teacher_name: str, student_name: str) -> None:
    """Refuse a teacher whose token ids mean other strings than the student's (one line, both named)."""
    tv, sv = teacher.get_vocab(), student.get_vocab()
    if tv != sv:
        differ = sum(1 for tok, i in sv.items() if tv.get(tok) != i)
        raise ConfigError(f"algorithm.distill.teacher {teacher_name!r} ({type(teacher).__name__}, {len(tv)} tokens) "
                          f"and the student {student_name!r} ({type(student).__name__}, {len(sv)} tokens) have "
                          f"different vocabularies ({differ} of the student's tokens differ): the teacher would "
                          "score other strings than were sampled, and cross-tokenizer distillation is not supported; "
                          "use a teacher with the student's tokenizer")


def _window(module: torch.nn.Module) -> int:
    """The longest sequence the model's positions cover."""
    from sleuth.training.rl.forward import causal_lm

    config = causal_lm(module).config
    return int(config.max_position_embeddings)
