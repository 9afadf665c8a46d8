"""YAML → typed config dataclasses, every key and value type checked, with dotted overrides (`--set a.b=1`) on top
and a one-line error for an unknown key (with the closest one) or a key that was renamed (with its new name)."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from sleuth.core.errors import ConfigError

RECIPES = Path(__file__).resolve().parents[1] / "configs"


def recipe_path(path: str | Path) -> Path:
    """A config file: a path, or the name of a shipped recipe (`docread_cigpo` → the package's
    `configs/docread_cigpo.yaml`), so recipes work from any directory."""
    p = Path(path)
    if p.exists():
        return p
    shipped = sorted(f.stem for f in RECIPES.glob("*.yaml"))
    name = p.name.removesuffix(".yaml")
    if name in shipped and len(p.parts) <= 2:  # `docread_cigpo`, `docread_cigpo.yaml`, `configs/docread_cigpo.yaml`
        return RECIPES / f"{name}.yaml"
    close = difflib.get_close_matches(name, shipped, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(f"config file {p} does not exist{hint}; shipped recipes: {', '.join(shipped)}")


def load_yaml(cls: type, path: str | Path | None = None, overrides: dict[str, Any] | None = None,
              renamed: dict[str, str] | None = None) -> Any:
    """A config dataclass `cls` from a YAML file (or its defaults) and dotted overrides, every key checked;
    `renamed` (old dotted key → new) refuses a key that moved, naming where it went."""
    data: dict[str, Any] = {}
    if path is not None:
        p = recipe_path(path)
        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:  # one line: what is wrong and where (PyYAML spreads it over five)
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ConfigError(f"{p} is not valid YAML{where}: {getattr(e, 'problem', None) or e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of keys, got {type(data).__name__}")
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ConfigError(f"cannot set {dotted}: {key} is not a section")
        node[leaf] = value
    return build(cls, data, "", renamed or {})


def build(cls: type, data: Any, where: str, renamed: dict[str, str]) -> Any:
    """Construct dataclass `cls` from a mapping, checking every key and value type."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(data).__name__} {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in fields:
            if path in renamed:
                raise ConfigError(f"config key {path!r} was renamed to {renamed[path]!r}")
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; valid keys: {', '.join(sorted(fields))}"
            raise ConfigError(f"unknown config key {path!r}{hint}")
        kwargs[key] = _value(hints[key], value, path, renamed)
    try:
        return cls(**kwargs)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _value(tp: Any, value: Any, path: str, renamed: dict[str, str]) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _value(arg, value, path, renamed)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0])
    if dataclasses.is_dataclass(tp):
        return build(tp, value, path, renamed)
    if tp is Any:
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list, got {type(value).__name__} {value!r}")
        inner = args[0] if args else Any
        return origin(_value(inner, v, f"{path}[{i}]", renamed) for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {type(value).__name__} {value!r}")
        return dict(value)
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):  # YAML reads 1e-6 (no dot) as a string
        try:
            return float(value)
        except ValueError:
            pass
    if isinstance(tp, type) and isinstance(value, tp) and not (tp is int and isinstance(value, bool)):
        return value
    raise ConfigError(f"{path}: expected {getattr(tp, '__name__', tp)}, got {type(value).__name__} {value!r}")


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
