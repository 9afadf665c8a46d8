"""Code (`sleuth/Code-v0`): write a Python function for an MBPP or HumanEval problem. Tools: `run(code)`
executes the program in the sandbox with the visible example test; `submit(code)` ends the episode and
the hidden tests score it. Extracting the program from a fenced block is the harness's job, done here
with `verifiers.extract.extract_code` (shared with the trainer adapters)."""

from __future__ import annotations

from typing import Any

from sleuth.envs.base import ToolEnv
from sleuth.envs.tools import ToolError, tool
from sleuth.sandbox import Limits, Sandbox
from sleuth.tasks.base import Task
from sleuth.verifiers.code import CodeVerifier
from sleuth.verifiers.extract import extract_code


class CodeEnv(ToolEnv):
    instructions = (
        "Solve the programming problem in Python. Use run to try your program on the example test, then "
        "submit the complete program (the function and any imports it needs)."
    )
    budget_unit = "runs"
    default_budget = 3

    def __init__(self, *, sandbox: Sandbox | None = None, **kwargs: Any):
        self.sandbox = sandbox or Sandbox(Limits(wall_s=10.0, output_bytes=2000))
        super().__init__(**kwargs)

    def default_verifier(self) -> CodeVerifier:
        return CodeVerifier()

    def on_reset(self, task: Task) -> None:
        p = task.payload
        if "test_list" not in p and "entry_point" not in p:
            raise ValueError(f"task {task.id} is not a code task (no test_list / entry_point in its payload)")
        self.example = p["test_list"][0] if p.get("test_list") else ""
        self.setup = p.get("test_setup_code") or ""
        self._last_run: dict[str, Any] | None = None

    def user_message(self, task: Task) -> str:
        p = task.payload
        if "entry_point" in p:
            return f"Complete this Python function:\n```python\n{p['prompt'].rstrip()}\n```"
        sig = f"\nYour function:\n```python\n{p['signature']}\n```" if p.get("signature") else ""
        return f"{task.question}{sig}\nIt must pass tests such as:\n```python\n{self.example}\n```"

    @tool
    def run(self, code: str) -> str:
        """Run your program in a sandbox together with the example test and see its output.

        Args:
            code: the complete Python program
        """
        program = extract_code(code)
        if not program.strip():
            raise ToolError("run needs a program: the code argument is empty")
        tail = "\n\n".join(x for x in (self.setup, self.example) if x)
        res = self.sandbox.run_python(f"{program}\n\n{tail}\n" if tail else program)
        self._last_run = {"status": res.status, "exit_code": res.exit_code, "example_passed": res.ok and bool(tail)}
        verdict = "the example test passed" if res.ok and tail else f"status: {res.status}, exit code {res.exit_code}"
        parts = [verdict]
        if res.stdout.strip():
            parts.append("stdout:\n" + res.stdout.strip())
        if res.stderr.strip():
            parts.append("stderr:\n" + res.stderr.strip()[-1500:])
        return "\n".join(parts)

    @tool(final=True)
    def submit(self, code: str) -> str:
        """Submit your final program; hidden tests decide the score.

        Args:
            code: the complete Python program
        """
        return extract_code(code)

    def step_info(self) -> dict[str, Any]:
        run, self._last_run = self._last_run, None
        return {"run": run} if run else {}
