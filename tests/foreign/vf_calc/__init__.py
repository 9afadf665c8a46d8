"""A verifiers (v1) environment as a user writes one, for sleuth's `verifiers:` family tests: sums to compute with
an MCP tool (a toolset the taskset shares across its rollouts), scored by an async `@vf.reward` on the final reply.
It exports no harness, so verifiers' default runs it (`bash`: the bundled chat program with a shell tool beside the
env's tools)."""
from vf_calc.taskset import CalcTaskset

__all__ = ["CalcTaskset"]
