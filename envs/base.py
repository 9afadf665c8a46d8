"""`ToolEnv`: a gymnasium env made of a task, a harness and a verifier. Subclasses add tools as
methods marked `@tool`; the base class does parsing, budgets, error observations and scoring."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import gymnasium
from gymnasium import spaces

from sleuth.envs.harness import Harness
from sleuth.envs.outcome import INFO_KEY, ResetInfo, StepInfo
from sleuth.envs.parsers import ParseResult, ToolCall
from sleuth.envs.tools import Tool, ToolResult, make_tool
from sleuth.tasks.base import Task
from sleuth.verifiers.base import Verdict, Verifier


class TextSpace(spaces.Text):
    """Any string up to `max_length` characters (gymnasium's Text only admits a fixed charset)."""

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length


class ToolEnv(gymnasium.Env):
    """reset(options={"task": Task}) → (prompt, info); step(action text) → (observation, reward,
    terminated, truncated, info). Malformed actions never raise: they yield an observation that says what
    was wrong, use up budget, and are recorded in `info["error"]`.

    Everything is a keyword: `tasks`, `verifier` (else `default_verifier()`), `harness`, `budget` (else the
    class's `default_budget`, counted in its `budget_unit`), `render_mode`. A subclass declares only what is
    its own (e.g. a retriever) and passes the rest through `**kwargs`."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"]}
    instructions: ClassVar[str] = "You are a helpful agent. Use the tools to solve the task."
    budget_unit: ClassVar[str] = "turns"
    default_budget: ClassVar[int] = 8

    def __init__(
        self,
        *,
        tasks: Sequence[Task] | None = None,
        verifier: Verifier | None = None,
        harness: Harness | str = "json",
        budget: int | None = None,
        render_mode: str | None = None,
    ):
        self.tasks = list(tasks) if tasks is not None else None
        self.verifier = verifier if verifier is not None else self.default_verifier()
        budget = self.default_budget if budget is None else budget
        self.harness = harness if isinstance(harness, Harness) else Harness(harness, budget, self.budget_unit)
        if self.harness.format == "free":
            raise ValueError(f"{type(self).__name__} acts through tools; the 'free' harness (the reply is the action) "
                             "is for envs without tools (reasoning_gym:, gem:, textarena:)")
        self.render_mode = render_mode
        self.observation_space = TextSpace(max_length=1 << 20)
        self.action_space = TextSpace(max_length=1 << 20)
        self.tools: dict[str, Tool] = {}
        for attr, spec in self._tool_specs().items():
            t = make_tool(getattr(self, attr), name=spec["name"], final=spec["final"])
            self.tools[t.name] = t
        if not any(t.final for t in self.tools.values()):
            raise TypeError(f"{type(self).__name__} needs at least one @tool(final=True) tool to end an episode")
        self._finals = [t.name for t in self.tools.values() if t.final]
        self._schemas = [t.schema() for t in self.tools.values()]
        self._system = self.harness.system_message(self.instructions, self.tools)
        self.task: Task | None = None

    @classmethod
    def entry_point(cls) -> str:
        """The env's class as "module:Class": reset's `info["env"]`, so a policy that sees only the reset info
        (the scripted oracle) can find the env's class; `make` builds the env from it."""
        return f"{cls.__module__}:{cls.__qualname__}"

    @classmethod
    def _tool_specs(cls) -> dict[str, dict[str, Any]]:
        if "_specs" not in cls.__dict__:
            specs = {}  # the class's own tools first, in the order written, then inherited ones (`answer`)
            for klass in cls.__mro__:
                for attr, val in vars(klass).items():
                    if callable(val) and hasattr(val, "__sleuth_tool__") and attr not in specs:
                        specs[attr] = val.__sleuth_tool__
            cls._specs = specs
        return cls._specs

    # -- hooks for subclasses -------------------------------------------------------------------
    def default_verifier(self) -> Verifier:
        raise TypeError(f"{type(self).__name__} needs a verifier: pass verifier=... or override default_verifier()")

    def on_reset(self, task: Task) -> None:
        """Build per-episode state from the task."""

    def user_message(self, task: Task) -> str:
        return task.question

    def verifier_context(self) -> dict[str, Any]:
        """Extra keyword arguments for the verifier (e.g. the evidence the agent read)."""
        return {}

    def step_read(self) -> dict[str, Any] | None:
        """The document this step showed, if any (`StepInfo.read`: whether it was gold, re-read, ...); called
        once a step, before `step_info`."""
        return None

    def step_info(self) -> dict[str, Any]:
        """The env's own per-step facts for `info` beside the typed `StepInfo` (a code run, a test report)."""
        return {}

    @classmethod
    def oracle(cls, task: Task, turn: int, start: ResetInfo) -> ToolCall:
        """The next tool call of an agent that knows the task's gold, at `turn` of an episode whose reset
        returned `info`: the `oracle` scripted policy plays it, and its episodes must score 1.0, which tests
        env, harness and verifier together. Here: the task's answer, in the first required argument of the
        env's first final tool; an env whose gold takes several steps overrides it."""
        attr, spec = next((attr, spec) for attr, spec in cls._tool_specs().items() if spec["final"])
        required = make_tool(getattr(cls, attr)).parameters["required"]
        return ToolCall(spec["name"], {required[0]: task.answer} if required else {})

    # -- gymnasium API --------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        task = (options or {}).get("task")
        if task is None:
            if not self.tasks:
                raise ValueError("reset needs options={'task': Task} or an env built with tasks=[...]")
            task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        if isinstance(task, dict):
            task = Task.from_dict(task)
        self.task = task
        self.turn = 0
        self.budget_left = self.harness.budget
        self.done = False
        try:
            self.on_reset(task)
            user = self.user_message(task)
        except Exception:  # a task this env cannot run: no half-reset episode to step; the next reset works
            self.task = None
            raise
        messages = [{"role": "system", "content": self._system}, {"role": "user", "content": user}]
        start = ResetInfo(messages, self._schemas, self.harness.format, self.harness.budget, self.entry_point())
        return user, {INFO_KEY: start, "task_id": task.id}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.task is None or self.done:
            raise RuntimeError("call reset() before step() (the episode is over or never started)")
        self.turn += 1
        out = StepInfo()
        info: dict[str, Any] = {"turn": self.turn}
        parsed = self._parse(action)
        truncated = False
        reward = 0.0
        if parsed.error:
            result = ToolResult.failed(parsed.error)
        else:
            call = parsed.calls[0]
            out.tool_call = call.to_dict()
            result = self._call(call)
        out.error = result.error
        obs = result.text
        if len(parsed.calls) > 1:
            obs += f"\n(only one tool call per turn: ignored {len(parsed.calls) - 1} more)"
        out.read = self.step_read()
        info.update(self.step_info())
        terminated = result.final
        response = result.text if terminated else None
        if not terminated:
            self.budget_left -= 1
            if self.budget_left < 0:
                truncated = True
            else:
                obs = f"{obs}\n{self.harness.budget_note(self.budget_left, self._finals)}"
        if terminated or truncated:
            self.done = True
            verdict = self.score(response or "")
            reward = float(verdict.score)
            out.verdict = verdict
            info["response"] = response
        obs = self.harness.clip(obs)
        out.messages = [] if self.done else [{"role": "tool", "content": obs}]
        return obs, reward, terminated, truncated, {**info, INFO_KEY: out}

    def score(self, response: str) -> Verdict:
        v = self.verifier(self.task, response, **self.verifier_context())
        return v if v.response is not None else Verdict(v.score, v.details, response=response)

    def render(self) -> str | None:
        if self.render_mode == "ansi" and self.task is not None:
            return f"[{type(self).__name__}] task={self.task.id} turn={self.turn} budget_left={self.budget_left}"
        return None

    # -- internals --------------------------------------------------------------------------------
    def _parse(self, action: Any) -> ParseResult:
        if not isinstance(action, str):
            return ParseResult(error=f"the action must be text, got {type(action).__name__}")
        return self.harness.parser.parse(action, self.tools)

    def _call(self, call: ToolCall) -> ToolResult:
        tool = self.tools.get(call.name)
        if tool is None:
            return ToolResult.failed(f"unknown tool {call.name!r}; available tools: {', '.join(self.tools)}")
        return tool.call(call.arguments)
