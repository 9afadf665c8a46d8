"""One registry idiom for every extension point of sleuth: envs, advantage estimators, verifiers, reply
extractors, task sources, tool-call formats and scripted policies. A `Registry` maps names to components,
says "did you mean" for a typo, and warns when a name is registered again with something else.

One call fills it: `register(name, component)` or `register(name, "module:attr")`, the string imported when
the name is first looked up (Gymnasium's idiom). Other installed packages declare components under the
registry's entry-point group; those are read at the first lookup and imported like strings, so importing
sleuth imports no plugin and a plugin that does not import costs only its own name. It imports nothing of
sleuth but the error root: every layer may use it.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sleuth.core.errors import BadInput

T = TypeVar("T")


class UnknownNameError(LookupError, BadInput):
    """A name no registry entry has; the message lists the known names and the closest one."""


@dataclass(frozen=True)
class Entry:
    """One registration, read without importing it."""
    target: str  # "module:attr": the string or entry point registered, or where a registered object is defined
    source: str  # who registered it: "sleuth", a plugin's distribution name, or "user"


def import_target(target: str) -> Any:
    """The object a "module:attr" string names (`attr` may be dotted: "module:Class.method")."""
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{target!r} is not 'module:attr'")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def target_of(obj: Any) -> str:
    """Where `obj` is defined, as "module:attr"; an instance is described by its class."""
    named = obj if hasattr(obj, "__qualname__") and hasattr(obj, "__module__") else type(obj)
    return f"{named.__module__}:{named.__qualname__}"


class Registry(Generic[T]):
    """Names → components of one kind.

    `group` is the entry-point group that other packages declare components under (name = the
    component's name, value = "module:attr"). `from_entry_point` turns such an entry point into the
    registered value (default: what the entry point names)."""

    def __init__(self, kind: str, group: str | None = None,
                 from_entry_point: Callable[[importlib.metadata.EntryPoint], T] | None = None):
        self.kind = kind
        self.group = group
        self._from_entry_point = from_entry_point
        self._entries: dict[str, Entry] = {}
        self._values: dict[str, T] = {}  # the components imported (or registered as objects)
        self._loaders: dict[str, Callable[[], T]] = {}  # what imports each of the others
        self._scanned = False

    def register(self, name: str, value: T | str, source: str = "user") -> T | str:
        """Add `value` under `name`: a component, or a "module:attr" string imported on the first lookup of
        `name`. Registering a name again with something else replaces it, with a warning. Returns `value`."""
        if isinstance(value, str):
            if ":" not in value:
                raise ValueError(f"{self.kind} {name!r}: {value!r} is neither a component nor 'module:attr'")
            self._add(name, Entry(value, source), lambda: import_target(value))
        else:
            self._add(name, Entry(target_of(value), source), value=value)
        return value

    def decorator(self, name: str, source: str = "user") -> Callable[[T], T]:
        """`@REGISTRY.decorator("name")`: `register` what it decorates, and return it unchanged."""
        def deco(value: T) -> T:
            self.register(name, value, source)
            return value
        return deco

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)
        self._values.pop(name, None)
        self._loaders.pop(name, None)

    def get(self, name: str) -> T:
        """The component registered as `name`, imported now if it was registered as a string or declared by
        a plugin; `UnknownNameError` with the closest name if there is none, `ImportError` naming the
        registration if it does not import."""
        entry = self.entry(name)
        if name not in self._values:
            try:
                self._values[name] = self._loaders[name]()
            except Exception as e:
                raise ImportError(f"the {self.kind} {name!r} that {entry.source} declares ({entry.target}) does "
                                  f"not load: {type(e).__name__}: {e}") from e
            del self._loaders[name]
        return self._values[name]

    def entry(self, name: str) -> Entry:
        """Where `name`'s component is and who registered it, without importing it."""
        self.load_entry_points()
        if name not in self._entries:
            self.load_entry_points(again=True)  # a package installed since the first scan
        if name not in self._entries:
            raise UnknownNameError(self.unknown(name))
        return self._entries[name]

    def unknown(self, name: str, aliases: Sequence[str] = ()) -> str:
        """The message for a name that is not registered: the closest known one (or alias), then all names."""
        known = self.names()
        close = difflib.get_close_matches(name, [*known, *aliases], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown {self.kind} {name!r}{hint}; known: {', '.join(known) or 'none'}"

    def names(self) -> list[str]:
        """Every registered name, plugins' included (none of them is imported)."""
        self.load_entry_points()
        return sorted(self._entries)

    def entries(self) -> dict[str, Entry]:
        """Every registration, plugins' included, by name (none of them is imported)."""
        self.load_entry_points()
        return dict(sorted(self._entries.items()))

    def __contains__(self, name: object) -> bool:
        self.load_entry_points()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def load_entry_points(self, again: bool = False) -> None:
        """Read the entry-point group once (`again`: read it for names not seen yet, as a lookup of an
        unknown name does); each plugin is imported when its name is first looked up. A plugin that
        declares a name already registered replaces it, with the override warning."""
        if (self._scanned and not again) or self.group is None:
            return
        first, self._scanned = not self._scanned, True
        for ep in importlib.metadata.entry_points(group=self.group):
            if first or ep.name not in self._entries:
                load = (lambda ep=ep: self._from_entry_point(ep)) if self._from_entry_point else ep.load
                self._add(ep.name, Entry(ep.value, ep.dist.name if ep.dist else "plugin"), load)

    def _add(self, name: str, entry: Entry, load: Callable[[], T] | None = None, value: Any = None) -> None:
        """The one way an entry goes in: `load` imports the component later, or `value` is the component."""
        old = self._entries.get(name)
        if old is not None and old.target == entry.target and load is not None:
            self._entries[name] = entry  # the same string again (a re-import): what was imported stays
            return
        if old is not None and (old.target != entry.target or self._values.get(name, value) != value):
            warnings.warn(f"{self.kind} {name!r} registered by {entry.source} replaces the one from {old.source}",
                          stacklevel=3)
        self.unregister(name)
        self._entries[name] = entry
        if load is not None:
            self._loaders[name] = load
        else:
            self._values[name] = value
