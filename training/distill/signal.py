"""On-policy distillation (OPD): a teacher's per-token signal on the student's own sampled episodes.

The student samples; a teacher scores exactly those token ids (`training/distill/teacher.py`); the update reads the
teacher's numbers beside, or instead of, the estimator's advantages. Only policy tokens get a signal: the
prompt, env replies and tool outputs of a multi-turn episode are context for both models and never a target.

- `reverse_kl` (the default; tinker-cookbook's `train_on_policy`, slime's `--use-opd`): the sampled-token
  log-ratio d_t = log π_s(y_t) − log π_T(y_t), an unbiased one-sample estimate of KL(π_s ‖ π_T) at that
  position, enters as a per-token penalty on the advantage, Â_t = A_t − λ·Σ_{k≥t} γ^(k−t)·d_k over the
  episode's later policy tokens (`discount` γ; 0 gives the per-token form). Through the policy-gradient
  surrogate its gradient is the score-function gradient of the reverse KL; the clip and any rollout
  correction act on it as on every advantage.
- `topk_forward_kl` / `jsd`: a loss term over the teacher's top-k ids at each sampled position, the rest of
  the vocabulary as one "tail" bucket on both sides: KL(T̃ ‖ S̃) (or the β-skewed Jensen–Shannon divergence)
  of two (k+1)-category distributions. The naive top-k form renormalises both sides over the k ids (or drops
  the tail), which stops being a divergence where the student puts its mass outside them and needs no
  gradient to leave; verl#5041 reports it unstable. With the tail bucket the value is a true divergence
  (≥ 0, 0 only where the two agree on the k ids and the tail) and the student is pulled out of the tail
  exactly as hard as the teacher's tail is small.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DISTILL_KINDS = ("reverse_kl", "topk_forward_kl", "jsd")
DISTILL_AT = ("current", "behaviour")
CONTEXT_FIELDS = ("answer", "supporting")  # besides `payload.<key>`; see teacher.privileged_text
TAIL_FLOOR = 1e-12  # a bucket's probability is floored here before the log (fp32 sums of k probabilities)


@dataclass
class TeacherTokens:
    """A teacher's numbers for one trajectory (or, batched, for a micro-batch's rows), aligned with the token
    ids: (L,) or (B, L), with a trailing k for the top-k ids; 0 off the policy tokens."""

    logprobs: torch.Tensor  # log π_T of each sampled token
    signal: torch.Tensor  # 1 where the teacher scored the token (a policy token that fit the teacher's window)
    turn: torch.Tensor  # long: the 1-based turn of each policy token, 0 elsewhere
    topk_ids: torch.Tensor | None = None  # the teacher's k likeliest ids at the position that predicts the token
    topk_logprobs: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> TeacherTokens:
        return TeacherTokens(*(x.to(device) if x is not None else None for x in (
            self.logprobs, self.signal, self.turn, self.topk_ids, self.topk_logprobs)))


@dataclass
class DistillConfig:
    """`algorithm.distill:`: the teacher and how its signal enters the update (off while `teacher` is unset)."""

    # A model name or directory with the student's tokenizer; `self`: the policy's own current weights (no second
    # model; with `teacher_context`, on-policy self-distillation from privileged context); or the URL of an
    # OpenAI-compatible server that returns prompt logprobs (vLLM), e.g. http://teacher-host:8000.
    teacher: str | None = None
    coef: float = 1.0  # λ: the weight of the penalty (reverse_kl) or of the loss term (topk kinds)
    kind: str = "reverse_kl"  # reverse_kl | topk_forward_kl | jsd
    # reverse_kl: γ of the penalty's sum over the episode's later policy tokens (0: each token its own)
    discount: float = 0.0
    # reverse_kl: log π_s is the trainer's current log-probability of the token (`current`: the same forward
    # code and dtype as the teacher's, so a teacher equal to the student gives exactly 0) or the rollout
    # engine's sampling one (`behaviour`: it also carries the engine–trainer mismatch).
    at: str = "current"
    top_k: int = 16  # topk kinds: the teacher's ids per position
    beta: float = 0.5  # jsd: the mixture's weight on the teacher, M = β·T + (1 − β)·S
    # Text the teacher sees before the episode and the student never does: `answer` (the gold answer and
    # aliases), `supporting` (the task's supporting documents) or `payload.<key>` (a task payload field).
    teacher_context: str | None = None
    teacher_temperature: float = 1.0  # the teacher's distribution is softmax(logits / this)
    teacher_dtype: str = "auto"  # auto (the policy's compute dtype) | float32 | bfloat16
    # Where a local teacher's weights and forward live: `auto` (the trainer's device) or `cpu` (a GPU run keeps the
    # accelerator's memory for the student; the teacher's forward runs on the host, its logprobs come back).
    teacher_device: str = "auto"

    def __post_init__(self) -> None:
        if self.kind not in DISTILL_KINDS:
            raise ValueError(f"algorithm.distill.kind must be one of {', '.join(DISTILL_KINDS)}; got {self.kind!r}")
        if self.at not in DISTILL_AT:
            raise ValueError(f"algorithm.distill.at must be one of {', '.join(DISTILL_AT)}; got {self.at!r}")
        if self.teacher_dtype not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"algorithm.distill.teacher_dtype must be auto, float32 or bfloat16; "
                             f"got {self.teacher_dtype!r}")
        if not self.coef > 0:
            raise ValueError(f"algorithm.distill.coef must be > 0, got {self.coef}")
        if not 0 <= self.discount <= 1:
            raise ValueError(f"algorithm.distill.discount must be in [0, 1], got {self.discount}")
        if not 0 < self.beta < 1:
            raise ValueError(f"algorithm.distill.beta must be in (0, 1), got {self.beta}")
        if self.top_k < 1:
            raise ValueError(f"algorithm.distill.top_k must be ≥ 1, got {self.top_k}")
        if not self.teacher_temperature > 0:
            raise ValueError(f"algorithm.distill.teacher_temperature must be > 0, got {self.teacher_temperature}")
        ctx = self.teacher_context
        if ctx is not None and ctx not in CONTEXT_FIELDS and not (ctx.startswith("payload.") and len(ctx) > 8):
            raise ValueError(f"algorithm.distill.teacher_context must be one of {', '.join(CONTEXT_FIELDS)} or "
                             f"payload.<key>; got {ctx!r}")
        if self.teacher_device not in ("auto", "cpu"):
            raise ValueError(f"algorithm.distill.teacher_device must be auto or cpu; got {self.teacher_device!r}")
        if self.teacher_device == "cpu" and (self.teacher == "self" or self.is_server):
            raise ValueError("algorithm.distill.teacher_device: cpu moves a local teacher model; a `self` teacher is "
                             "the policy on its own device and a server's model is the server's")
        if self.is_server and self.teacher_temperature != 1.0:
            raise ValueError("algorithm.distill.teacher_temperature: a server teacher's prompt logprobs are at its "
                             "model's own temperature (1); leave teacher_temperature at 1.0")
        if self.teacher == "self" and ctx is None:
            raise ValueError("algorithm.distill.teacher: self is the student itself: without teacher_context it "
                             "knows nothing the student does not (every signal would be 0)")

    @property
    def enabled(self) -> bool:
        return self.teacher is not None

    @property
    def is_server(self) -> bool:
        """The teacher is an OpenAI-compatible server's URL (`training/distill/server_teacher.py`)."""
        return self.teacher is not None and self.teacher.startswith(("http://", "https://"))

    @property
    def needs_topk(self) -> bool:
        return self.kind != "reverse_kl"


def reverse_kl_penalty(student_logp: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor,
                       discount: float) -> torch.Tensor:
    """(B, L) Σ_{k≥t} γ^(k−t)·(log π_s − log π_T)_k over each row's masked tokens (k counts masked tokens
    only: an env reply between two turns is no step), 0 off the mask; detached."""
    d = ((student_logp - teacher_logp) * mask).detach()
    if discount == 0:
        return d
    out = torch.zeros_like(d)
    for row in range(d.shape[0]):
        idx = mask[row].nonzero().squeeze(-1)
        acc = d.new_zeros(())
        for i in reversed(idx.tolist()):
            acc = d[row, i] + discount * acc
            out[row, i] = acc
    return out


def _with_tail(logp: torch.Tensor) -> torch.Tensor:
    """(n, k) log-probabilities of k ids → (n, k + 1) with the log of the rest of the mass appended."""
    tail = torch.log((-torch.expm1(torch.logsumexp(logp, dim=-1))).clamp(min=TAIL_FLOOR))
    return torch.cat([logp, tail.unsqueeze(-1)], dim=-1)


def _kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """Σ p (log p − log q) over the last dimension, 0·log 0 = 0."""
    p = log_p.exp()
    return torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p)).sum(-1)


def topk_divergence(student_topk: torch.Tensor, teacher_topk: torch.Tensor, kind: str,
                    beta: float = 0.5) -> torch.Tensor:
    """(n,) per-position divergence of the student from the teacher over the teacher's top-k ids plus the tail
    bucket: `student_topk` (n, k) the student's log-probabilities of those ids (carries the gradient),
    `teacher_topk` (n, k) the teacher's. With T, S the two (k+1)-bucket distributions: `topk_forward_kl` is
    KL(T ‖ S); `jsd` is β·KL(T ‖ M) + (1 − β)·KL(S ‖ M), M = β·T + (1 − β)·S."""
    s, t = _with_tail(student_topk.float()), _with_tail(teacher_topk.float().detach())
    if kind == "topk_forward_kl":
        return _kl(t, s)
    if kind == "jsd":
        m = torch.logsumexp(torch.stack([t + torch.log(torch.tensor(beta)),
                                         s + torch.log(torch.tensor(1 - beta))]), dim=0)
        return beta * _kl(t, m) + (1 - beta) * _kl(s, m)
    raise ValueError(f"unknown top-k divergence {kind!r}")
