"""One registry idiom for every extension point of sleuth: envs, advantage estimators, verifiers, task
sources and tool-call parsers. A `Registry` maps names to components, says "did you mean" for a typo,
loads the components that other installed packages declare under its entry-point group once, and warns
when a name is registered again with something else. It imports nothing of sleuth: every layer may use it.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(LookupError, ValueError):
    """A name no registry entry has; the message lists the known names and the closest one."""


@dataclass(frozen=True)
class Entry(Generic[T]):
    value: T
    source: str  # who registered it: "sleuth", a plugin's distribution name, or "user"


class Registry(Generic[T]):
    """Names → components of one kind.

    `group` is the entry-point group that other packages declare components under (name = the
    component's name, value = "module:attr"). `from_entry_point` turns such an entry point into the
    registered value; by default the entry point is loaded (imported) only when the name is first asked
    for, so a broken plugin costs its own name, not every import of sleuth."""

    def __init__(self, kind: str, group: str | None = None,
                 from_entry_point: Callable[[importlib.metadata.EntryPoint], T] | None = None):
        self.kind = kind
        self.group = group
        self._from_entry_point = from_entry_point
        self._entries: dict[str, Entry[T]] = {}
        self._pending: dict[str, importlib.metadata.EntryPoint] = {}
        self._scanned = False

    def register(self, name: str, value: T, source: str = "user") -> T:
        """Add `value` under `name`; registering a name again with another value replaces it, with a warning."""
        old = self._entries.get(name)
        if old is not None and old.value != value:
            warnings.warn(f"{self.kind} {name!r} registered by {source} replaces the one from {old.source}",
                          stacklevel=2)
        self._pending.pop(name, None)
        self._entries[name] = Entry(value, source)
        return value

    def decorator(self, name: str, source: str = "user") -> Callable[[T], T]:
        """`@REGISTRY.decorator("name")` registers what it decorates and returns it unchanged."""
        def deco(value: T) -> T:
            return self.register(name, value, source)
        return deco

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)
        self._pending.pop(name, None)

    def get(self, name: str) -> T:
        """The component registered as `name`; `UnknownNameError` with the closest name if there is none."""
        return self.entry(name).value

    def entry(self, name: str) -> Entry[T]:
        self.load_entry_points()
        if name not in self._entries and name not in self._pending:
            self.load_entry_points(again=True)  # a package installed since the first scan
        if name in self._pending:
            self._resolve(name)
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
        self.load_entry_points()
        return sorted({*self._entries, *self._pending})

    def entries(self) -> dict[str, Entry[T]]:
        """Every registration, plugins' included (their entry points are loaded here)."""
        for name in list(self._pending):
            self._resolve(name)
        return dict(sorted(self._entries.items()))

    def __contains__(self, name: object) -> bool:
        self.load_entry_points()
        return name in self._entries or name in self._pending

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def load_entry_points(self, again: bool = False) -> None:
        """Read the entry-point group once (`again`: read it for names not seen yet, as a lookup of an
        unknown name does); each plugin is imported when its name is first asked for. A plugin that
        declares a name already registered replaces it then, with the override warning."""
        if (self._scanned and not again) or self.group is None:
            return
        first, self._scanned = not self._scanned, True
        for ep in importlib.metadata.entry_points(group=self.group):
            if first or (ep.name not in self._entries and ep.name not in self._pending):
                self._pending[ep.name] = ep

    def _resolve(self, name: str) -> None:
        ep = self._pending.pop(name)
        source = ep.dist.name if ep.dist else "plugin"
        try:
            value = self._from_entry_point(ep) if self._from_entry_point else ep.load()
        except Exception as e:
            raise ImportError(f"the {self.kind} {name!r} that {source} declares ({ep.value}) does not load: "
                              f"{type(e).__name__}: {e}") from e
        self.register(name, value, source)
