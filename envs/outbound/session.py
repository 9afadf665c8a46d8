"""`ToolSession`: one sleuth tool env and its tasks, driven by tool calls (name, arguments) rather than by a
policy's reply text. It is what every outbound form shares (an OpenEnv server, GEM's registry, a TRL
`environment_factory`): a call is rendered in the env's own harness format and stepped, so the turn budget,
the observation of a malformed call and the verifier's score are exactly the env's own. Answers never leave
the session: a caller sees the question, the tools, the observations and the reward."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sleuth.envs.base import ToolEnv
from sleuth.envs.outcome import reset_info, step_info
from sleuth.envs.parsers import ToolCall
from sleuth.envs.registry import make
from sleuth.tasks.base import Task

OVER = "the episode is over: reset to start another"


@dataclass(frozen=True)
class Turn:
    """What a caller sees after a reset or a tool call: the text (the question, or the tool's observation), the
    reward (the verifier's score on the turn that ends the episode, else 0), whether the episode ended (a final
    tool: `terminated`; the turn budget: `truncated`), and the error the call made (also in `text`), if any."""
    text: str
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    error: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


def load_task_list(tasks: str | Sequence[Task]) -> list[Task]:
    """A task spec (`hotpotqa:dev`, a Task JSONL, ...) or Tasks; an empty set is refused here, not at reset."""
    if isinstance(tasks, str):
        from sleuth.tasks import load_tasks

        loaded = load_tasks(tasks)
    else:
        loaded = list(tasks)
    if not loaded:
        raise ValueError(f"no tasks in {tasks!r}")
    return loaded


class ToolSession:
    """Episodes of one env over a fixed task list. `reset(seed=i)` plays task `i % len(tasks)` (a caller that
    passes seeds 0, 1, 2, ... walks the tasks in order), `reset(task_id=...)` a named task, `reset()` the next one."""

    def __init__(self, env_id: str, tasks: str | Sequence[Task], **env_args: Any):
        self.env_id = env_id
        self.tasks = load_task_list(tasks)
        self._by_id = {t.id: t for t in self.tasks}
        env = make(env_id, **env_args).unwrapped
        if not isinstance(env, ToolEnv):
            raise TypeError(f"{env_id} is not a tool env ({type(env).__name__}); outbound forms serve sleuth's "
                            "tool envs (DocRead-v0, Search-v0, Code-v0, SWE-v0, your own ToolEnv)")
        self.env: ToolEnv = env
        self._next = 0
        self.task: Task | None = None
        self.system = ""
        self.turn: Turn | None = None

    @property
    def instructions(self) -> str:
        return self.env.instructions

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The env's tools, OpenAI function-calling schemas."""
        return [t.schema() for t in self.env.tools.values()]

    def pick(self, seed: int | None = None, task_id: str | None = None) -> Task:
        if task_id is not None:
            if task_id not in self._by_id:
                raise KeyError(f"no task {task_id!r} among the {len(self.tasks)} served")
            return self._by_id[task_id]
        index = self._next if seed is None else seed
        self._next = index + 1
        return self.tasks[index % len(self.tasks)]

    def reset(self, seed: int | None = None, task_id: str | None = None) -> Turn:
        task = self.pick(seed, task_id)
        question, info = self.env.reset(seed=seed, options={"task": task})
        self.task = task
        # the env's system message: its instructions, its tools and how to call them in its harness format
        self.system = next((m["content"] for m in reset_info(info).messages if m["role"] == "system"), "")
        self.turn = Turn(question, details={"task_id": task.id})
        return self.turn

    def call(self, name: str, arguments: dict[str, Any]) -> Turn:
        """One tool call as one env step. After the episode ended, a call changes nothing and says so."""
        return self.act(self.env.harness.parser.render(ToolCall(name, dict(arguments))))

    def act(self, action: str) -> Turn:
        """One reply of a model, as text in the env's harness format, as one env step."""
        if self.task is None:
            return Turn("call reset first", error="call reset first")
        if self.env.done:
            return Turn(OVER, terminated=True, error=OVER)
        obs, reward, terminated, truncated, info = self.env.step(action)
        out = step_info(info)
        details = {"verdict": out.verdict.to_dict()} if out.verdict is not None else {}
        self.turn = Turn(obs, float(reward), terminated, truncated, out.error, details)
        return self.turn

    @property
    def done(self) -> bool:
        return self.task is not None and self.env.done

    def final_reward(self) -> float:
        """The episode's score: the verifier's verdict if it ended, else what the env gives an episode that ran
        out of turns without an answer (its verdict on an empty response)."""
        if self.task is None:
            raise RuntimeError("no episode was played: call reset first")
        if self.done:
            return self.turn.reward
        return float(self.env.score("").score)

    def close(self) -> None:
        self.env.close()
