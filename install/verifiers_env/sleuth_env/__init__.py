"""`vf-eval sleuth-env --env.taskset.env sleuth/DocRead-v0 --env.taskset.tasks hotpotqa:dev`: a sleuth tool env as a
verifiers environment (see sleuth.envs.outbound.vf_env)."""

from sleuth.envs.outbound.vf_env import SleuthEnv, SleuthHarness, SleuthTaskset

__all__ = ["SleuthEnv", "SleuthHarness", "SleuthTaskset"]
