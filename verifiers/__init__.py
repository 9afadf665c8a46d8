"""Verifiers: pure scoring of a task's answer, usable without envs or torch."""

from sleuth.verifiers.base import Verdict, Verifier
from sleuth.verifiers.qa import QAVerifier, exact_match, normalize_answer, support_recall, token_f1

__all__ = ["Verdict", "Verifier", "QAVerifier", "exact_match", "normalize_answer", "support_recall", "token_f1"]
