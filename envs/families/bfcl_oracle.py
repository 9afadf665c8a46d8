"""BFCL's possible answers as the replies of a function-calling model (the `oracle` policy on `bfcl:` envs).

A single-turn possible answer lists, per argument, every accepted value (`""`: the argument may be left out); a
dict-typed argument is itself such a spec, also inside a list. The oracle takes the first accepted value of each.
BFCL's Java and JavaScript items declare every parameter as a string holding a Java / JavaScript literal (its
checker parses them back with `java_type_converter` / `js_type_converter` by the original type): the oracle writes
each value as that literal, from the original types the task loader keeps (`payload.source_types`). A relevance
item (a call is wanted, any call) gets a call of its first tool.

A multi-turn ground truth is, per user turn, a list of Python call strings (`sort('final_report.pdf')`); the
oracle makes a turn's calls in one reply, then a reply without a call, which ends the turn. Positional arguments
are named in the order the function doc lists its parameters."""

from __future__ import annotations

import ast
import json
from typing import Any

from sleuth.envs.parsers import ToolCall

Spec = dict[str, list[Any]]


def first_accepted(options: Any) -> Any:
    return next(o for o in options if o != "")


def argument(options: list[Any]) -> Any:
    """An argument's value from its accepted values, read as BFCL's checker reads them: a dict is a spec of its
    own (`dict_checker`), as is each dict of a list (`list_dict_checker`); inside a spec, values are compared as
    they are (`live_multiple_121-46-0`), and a text where a list of values belongs is its characters
    (`simple_java_64`)."""
    value = first_accepted(options)
    if isinstance(value, dict):
        return _spec(value)
    if isinstance(value, list):
        return [_spec(x) if isinstance(x, dict) else x for x in value]
    return value


def _spec(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: first_accepted(opts) for k, opts in spec.items() if any(o != "" for o in opts)}


def java_literal(v: Any, kind: str, nested: str | None = None) -> str:
    """`v` as the Java literal BFCL's `java_type_converter` reads back as `v` for a parameter of type `kind`. A
    value the possible answer already holds as text (a constant such as `ResultSet.TYPE_SCROLL_INSENSITIVE`, a
    literal) is written as it is: the converter leaves text it cannot parse as text."""
    if isinstance(v, str):
        return v
    if kind == "boolean":
        return "true" if v else "false"
    if kind in ("integer", "short", "byte"):
        return str(int(v))
    if kind == "long":
        return f"{int(v)}L"
    if kind == "float":
        return f"{v}f"
    if kind == "double":
        return str(float(v))
    if kind == "Array":
        return f"new {nested or 'Object'}[]{{" + ", ".join(java_literal(x, nested) if nested else _java_value(x)
                                                          for x in v) + "}"
    if kind == "ArrayList":
        parts = [json.dumps(x) if nested == "String" else f"'{x}'" if nested == "char" else
                 java_literal(x, nested) if nested else _java_value(x) for x in v]
        return "new ArrayList<>(Arrays.asList(" + ", ".join(parts) + "))"
    if kind == "HashMap":
        return "new HashMap<String, Object>() {{ " + " ".join(f'put("{k}", {_java_value(x)});'
                                                             for k, x in v.items()) + " }}"
    return json.dumps(v)  # String, any, char hold text (above); anything else as JSON


def _java_value(v: Any) -> str:
    """A value BFCL reads without a declared type (`parse_java_value`)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    return str(v)


def js_literal(v: Any, kind: str, nested: str | None = None) -> str:
    """`v` as the JavaScript literal BFCL's `js_type_converter` reads back as `v` for a parameter of type `kind`
    (text the possible answer holds is written as it is, as for Java)."""
    if isinstance(v, str):
        return v
    if kind == "Boolean":
        return "true" if v else "false"
    if kind == "integer":
        return str(int(v))
    if kind == "float":
        return _plain_number(v)
    if kind == "Bigint":
        return f"{int(v)}n"
    if kind == "array":
        return "[" + ", ".join(js_literal(x, nested) if nested and nested != "String" else _js_value(x)
                               for x in v) + "]"
    if kind == "dict":
        return "{" + ", ".join(f"{k}: {_js_value(x)}" for k, x in v.items()) + "}"
    return json.dumps(v)


def _plain_number(v: Any) -> str:
    text = str(v)
    return format(float(v), "f").rstrip("0").rstrip(".") if "e" in text.lower() else text


def _js_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_js_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_js_value(x)}" for k, x in v.items()) + "}"
    return _plain_number(v)


def single_turn_calls(truth: list[dict[str, Spec]] | None, source_types: dict[str, Any] | None,
                      language: str, tools: list[dict[str, Any]]) -> list[ToolCall]:
    """The calls of a single-turn item's reply. `truth` None: an irrelevance item (no call) or a relevance item
    (`tools` given: a call of the first tool, with its required arguments empty)."""
    if truth is None:
        if language != "relevance" or not tools:
            return []
        fn = tools[0]["function"]
        return [ToolCall(fn["name"], {p: "" for p in fn.get("parameters", {}).get("required", [])})]
    calls = []
    for call in truth:
        (name, spec), = call.items()
        args = {k: argument(opts) for k, opts in spec.items() if any(o != "" for o in opts)}
        if language in ("java", "javascript"):
            types = (source_types or {})[name]
            literal = java_literal if language == "java" else js_literal
            args = {k: literal(v, *types[k]) for k, v in args.items()}
        calls.append(ToolCall(name.replace(".", "_"), args))
    return calls


def multi_turn_replies(truth: list[list[str]], functions: dict[str, dict[str, Any]]) -> list[list[ToolCall]]:
    """Every reply of a multi-turn item: each turn's calls in one reply, then a reply without a call."""
    replies: list[list[ToolCall]] = []
    for calls in truth:
        if calls:
            replies.append([parse_call(c, functions) for c in calls])
        replies.append([])
    return replies


def parse_call(text: str, functions: dict[str, dict[str, Any]]) -> ToolCall:
    """`sort('final_report.pdf')` as a tool call; positional arguments named in the function doc's order."""
    node = ast.parse(text, mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a call: {text!r}")
    params = list(functions[node.func.id]["parameters"]["properties"])
    args = {params[i]: ast.literal_eval(a) for i, a in enumerate(node.args)}
    args.update({k.arg: ast.literal_eval(k.value) for k in node.keywords})
    return ToolCall(node.func.id, args)
