"""Tools: a Python callable plus the JSON schema a model sees. `@tool` builds the schema from type hints
and the docstring, so a tool is written once, as a plain method."""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sleuth.core.errors import SleuthError

_JSON_TYPES: dict[Any, str] = {
    str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object",
}
_PY_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "array": (list,),
    "object": (dict,),
}


class ToolError(SleuthError):
    """Raised by a tool for a bad request the model can fix (shown to it as the observation)."""


@dataclass(frozen=True)
class ToolResult:
    """What one tool call gives the env: the observation text; whether it ended the episode (then `text` is
    the response the verifier scores); the error the model made, if any (also shown to it as `text`)."""
    text: str
    final: bool = False
    error: str | None = None

    @classmethod
    def failed(cls, message: str) -> ToolResult:
        return cls(message, error=message)


@dataclass
class Tool:
    name: str
    fn: Callable[..., Any]
    description: str
    parameters: dict[str, Any]
    final: bool = False  # calling it ends the episode; its return value is the response to verify

    @classmethod
    def run_elsewhere(cls, spec: dict[str, Any]) -> Tool:
        """A tool from its OpenAI function-calling schema that someone else runs (an agent behind the gateway, a
        foreign env): its schema feeds a harness's instructions and parser; calling it here is an error. Raises
        KeyError / TypeError on a schema without `function.name`."""
        f = spec["function"]
        return cls(f["name"], _run_elsewhere, f.get("description") or "",
                   f.get("parameters") or {"type": "object", "properties": {}})

    def schema(self) -> dict[str, Any]:
        """OpenAI function-calling schema."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    def check_arguments(self, args: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """Validate (and leniently coerce) arguments. Returns (arguments, error message or None)."""
        props = self.parameters.get("properties", {})
        missing = [p for p in self.parameters.get("required", []) if p not in args]
        if missing:
            return args, f"missing argument(s) {missing} for tool {self.name!r}; it takes {list(props)}"
        unknown = [a for a in args if a not in props]
        if unknown:
            return args, f"unknown argument(s) {unknown} for tool {self.name!r}; it takes {list(props)}"
        out = {}
        for key, value in args.items():
            value, ok = _coerce(value, props[key].get("type"))
            if not ok:
                want = props[key].get("type")
                return args, (f"argument {key!r} of tool {self.name!r} must be {want}, "
                              f"got {type(value).__name__} {value!r:.60}")
            out[key] = value
        return out, None

    def call(self, arguments: dict[str, Any]) -> ToolResult:
        """Run the tool on a model's arguments. Bad arguments, a `ToolError` and a bug in the tool itself all
        come back as a failed result the model sees: one tool must not kill a batch of rollouts."""
        args, err = self.check_arguments(arguments)
        if err:
            return ToolResult.failed(err)
        try:
            out = self.fn(**args)
        except ToolError as e:
            return ToolResult.failed(str(e))
        except Exception as e:
            return ToolResult.failed(f"tool {self.name!r} failed: {type(e).__name__}: {e}")
        return ToolResult("" if out is None else str(out), final=self.final)


def _coerce(value: Any, json_type: str | list[str] | None) -> tuple[Any, bool]:
    """Accept a value of the declared JSON type; numeric strings count for integer/number (small models
    often quote numbers). bool is not an integer here even though Python says so."""
    if json_type is None:
        return value, True
    kinds = [json_type] if isinstance(json_type, str) else list(json_type)
    if isinstance(value, str) and "integer" in kinds and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        try:
            return int(value), True
        except ValueError:  # more digits than Python converts (4300): no index or count is that long
            return value, False
    for kind in kinds:
        if isinstance(value, _PY_TYPES.get(kind, ())) and not (kind in ("integer", "number")
                                                               and isinstance(value, bool)):
            return value, True
    if isinstance(value, str):
        s = value.strip()
        if "number" in kinds and re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", s):
            return float(s), True
    return value, False


def _json_type(annotation: Any) -> str | list[str] | None:
    if annotation is inspect.Parameter.empty or annotation is Any:
        return None
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        kinds = [_json_type(a) for a in typing.get_args(annotation) if a is not type(None)]
        flat = [k for k in kinds if isinstance(k, str)]
        return flat[0] if len(flat) == 1 else flat
    return _JSON_TYPES.get(origin or annotation)


def _param_docs(doc: str) -> dict[str, str]:
    """Google-style `Args:` section → {name: description}."""
    out: dict[str, str] = {}
    m = re.search(r"^\s*Args:\s*\n(.*?)(?:\n\s*\n|\Z)", doc, re.S | re.M)
    if m:
        for line in m.group(1).splitlines():
            pm = re.match(r"\s*(\w+)\s*(?:\([^)]*\))?:\s*(.+)", line)
            if pm:
                out[pm.group(1)] = pm.group(2).strip()
    return out


def make_tool(fn: Callable[..., Any], name: str | None = None, final: bool = False) -> Tool:
    """Build a `Tool` from a (bound) function's signature and docstring."""
    doc = inspect.getdoc(fn) or ""
    description = doc.split("\n\n")[0].replace("\n", " ").strip()
    pdocs = _param_docs(doc)
    hints = typing.get_type_hints(fn)
    props: dict[str, Any] = {}
    required = []
    for p in inspect.signature(fn).parameters.values():
        if p.name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        spec: dict[str, Any] = {}
        jt = _json_type(hints.get(p.name, p.annotation))
        if jt is not None:
            spec["type"] = jt
        if p.name in pdocs:
            spec["description"] = pdocs[p.name]
        props[p.name] = spec
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
    params = {"type": "object", "properties": props, "required": required}
    return Tool(name=name or fn.__name__, fn=fn, description=description, parameters=params, final=final)


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None, final: bool = False):
    """Mark an env method as a tool: `@tool` or `@tool(final=True)` for the call that ends the episode."""

    def mark(f: Callable[..., Any]) -> Callable[..., Any]:
        f.__sleuth_tool__ = {"name": name or f.__name__, "final": final}  # type: ignore[attr-defined]
        return f

    return mark(fn) if fn is not None else mark


def _run_elsewhere(**_: Any) -> Any:
    raise RuntimeError("this tool is run by whoever offered it (an agent, a foreign env), never by sleuth")
