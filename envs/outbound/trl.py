"""A sleuth tool env as TRL's `environment_factory` (`GRPOTrainer(environment_factory=...)`, TRL ≥ 1.0):

    from sleuth.envs.outbound.trl import environment_factory, task_dataset
    DocRead = environment_factory("sleuth/DocRead-v0", "hotpotqa:train")
    trainer = GRPOTrainer(model=..., train_dataset=task_dataset(DocRead), environment_factory=DocRead, ...)

TRL's contract: the env class's public methods are the tools (TRL builds their schemas from the signature and a
Google-style docstring), `reset(**example)` returns text appended to the last user message, and `get_reward()`
scores a finished rollout. Here each tool is a method made from the tool's JSON schema (names, types, defaults and
descriptions are the schema's), a call is a step of the env (its budget, its malformed-call observations), and
`get_reward` is the verifier's score, or, for a rollout that never called a final tool, the env's verdict on an
empty response (what a sleuth episode that ran out of turns gets)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, ClassVar, Union

from sleuth.envs.outbound.session import ToolSession, load_task_list
from sleuth.tasks.base import Task

_PY = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}


def _annotation(prop: dict[str, Any]) -> Any:
    kinds = prop.get("type", "string")
    types = [_PY.get(k, str) for k in (kinds if isinstance(kinds, list) else [kinds])]
    return types[0] if len(types) == 1 else Union[tuple(types)]  # noqa: UP007 (a runtime Union of a list)


def _docstring(description: str, props: dict[str, Any]) -> str:
    args = "\n".join(f"    {name}: {p.get('description') or name}" for name, p in props.items())
    return f"{description}\n\nArgs:\n{args}\n" if props else description


def _tool_method(schema: dict[str, Any]) -> Any:
    """A method `name(self, <params>) -> str` that calls the tool: what TRL reads as a tool."""
    fn = schema["function"]
    name, params = fn["name"], fn["parameters"]
    props, required = params.get("properties", {}), set(params.get("required", []))

    def method(self: SleuthTools, **arguments: Any) -> str:
        return self.session.call(name, arguments).text

    signature = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    # required parameters first: a Python signature puts defaults last, whatever order the schema lists
    for key in sorted(props, key=lambda k: k not in required):
        default = inspect.Parameter.empty if key in required else props[key].get("default")
        signature.append(inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY if key not in required else
                                           inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default,
                                           annotation=_annotation(props[key])))
    method.__signature__ = inspect.Signature(signature, return_annotation=str)
    method.__annotations__ = {**{k: _annotation(p) for k, p in props.items()}, "return": str}
    method.__name__ = method.__qualname__ = name
    method.__doc__ = _docstring(fn["description"], props)
    return method


class SleuthTools:
    """The base of the classes `environment_factory` makes: one `ToolSession` per instance (TRL makes one per
    concurrent rollout and resets it between rollouts)."""

    env_id: ClassVar[str]
    env_args: ClassVar[dict[str, Any]]
    tasks: ClassVar[list[Task]]
    instructions: ClassVar[str]

    def __init__(self) -> None:
        self.session = ToolSession(self.env_id, self.tasks, **self.env_args)

    def reset(self, task_id: str | None = None, **example: Any) -> str:
        """Start the episode of the example's task (`task_id`, from `task_dataset`; else the next task)."""
        return self.session.reset(task_id=task_id).text

    def get_reward(self) -> float:
        return self.session.final_reward()


_RESERVED = {"reset", "get_reward", "session", *SleuthTools.__annotations__}


def environment_factory(env_id: str, tasks: str | Sequence[Task], **env_args: Any) -> type[SleuthTools]:
    """A class for TRL's `environment_factory`: `env_id` (any sleuth tool env) over `tasks`, `env_args` to `make`."""
    loaded = load_task_list(tasks)
    probe = ToolSession(env_id, loaded[:1], **env_args)  # a bad env id or argument fails here, once
    schemas, instructions = probe.tool_schemas(), probe.instructions
    probe.close()
    members: dict[str, Any] = {"env_id": env_id, "env_args": dict(env_args), "tasks": loaded,
                               "instructions": instructions}
    for schema in schemas:
        name = schema["function"]["name"]
        if name in _RESERVED or name.startswith("_"):
            raise ValueError(f"{env_id}'s tool {name!r} clashes with a name of TRL's env class: {sorted(_RESERVED)}")
        members[name] = _tool_method(schema)
    cls_name = env_id.rpartition("/")[2].split("-v")[0].replace("-", "_") + "Tools"
    return type(cls_name, (SleuthTools,), members)


def task_dataset(env_cls: type[SleuthTools], limit: int | None = None):
    """TRL's `train_dataset` for `env_cls`: per task, the env's instructions as the system message, an empty user
    message (reset appends the question) and the `task_id` reset reads."""
    from datasets import Dataset

    rows = [{"prompt": [{"role": "system", "content": env_cls.instructions}, {"role": "user", "content": ""}],
             "task_id": t.id} for t in env_cls.tasks[:limit]]
    return Dataset.from_list(rows)
