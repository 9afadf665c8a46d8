"""LLM judges as verifiers, over any OpenAI-compatible endpoint: `judge:FILE` names one (see `JudgeConfig`)."""

from sleuth.verifiers.judge.client import JudgeClient, JudgeStats, JudgeUnavailable
from sleuth.verifiers.judge.config import JudgeConfig, JudgeConfigError
from sleuth.verifiers.judge.judges import GroupJudge, PointwiseJudge, load_judge

__all__ = ["GroupJudge", "JudgeClient", "JudgeConfig", "JudgeConfigError", "JudgeStats", "JudgeUnavailable",
           "PointwiseJudge", "load_judge"]
