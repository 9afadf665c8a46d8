"""Env registration through gymnasium's registry, under the `sleuth/` namespace by default, so
`gymnasium.make("sleuth/DocRead-v0")` and `sleuth.make("DocRead-v0")` build the same env. `ENVS` (a
`sleuth.registry.Registry`) records who registered each id; gymnasium holds the env specs.

Plugins: another installed package registers envs through the entry-point group `sleuth.envs`
(name = env id, value = "module:Class"), e.g. in its pyproject.toml:

    [project.entry-points."sleuth.envs"]
    "acme/Sql-v0" = "acme_envs.sql:SqlEnv"

They are registered when sleuth is imported (the class is imported only when the env is made).
`make("module:Class")` also builds any env class directly.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium

from sleuth.registry import Registry, UnknownNameError

NAMESPACE = "sleuth"
ENV_GROUP = "sleuth.envs"


@dataclass(frozen=True)
class Registration:
    entry_point: str
    source: str  # the distribution that registered it ("sleuth", a plugin's name, or "user")


class UnknownEnvError(UnknownNameError, gymnasium.error.NameNotFound):
    """An env id that is registered neither with sleuth nor with gymnasium."""


# The entry-point group is read by `load_plugins` at import, not lazily: gymnasium must know every id then.
ENVS: Registry[Registration] = Registry("env")


def _full_id(env_id: str) -> str:
    return env_id if "/" in env_id else f"{NAMESPACE}/{env_id}"


def register(env_id: str, entry_point: str | Callable[..., gymnasium.Env], source: str = "user",
             **kwargs: Any) -> str:
    """Register an env (a class, a factory, or a "module:Class" string). Ids without a namespace go under
    `sleuth/`. Registering a taken id with another entry point replaces it, with a warning. Returns the
    full id."""
    full = _full_id(env_id)
    where = entry_point if isinstance(entry_point, str) else f"{entry_point.__module__}:{entry_point.__qualname__}"
    ENVS.register(full, Registration(where, source), source)
    if full in gymnasium.registry:
        del gymnasium.registry[full]
    gymnasium.register(id=full, entry_point=entry_point, kwargs=kwargs)
    return full


def make(env_id: str, **kwargs: Any) -> gymnasium.Env:
    """`gymnasium.make` with the `sleuth/` namespace implied; "package.module:Class" builds that class."""
    if ":" in env_id and "/" not in env_id:
        module, _, cls = env_id.partition(":")
        full = _full_id(f"{module}.{cls}")
        if full not in gymnasium.registry:
            register(full, env_id, source="module:Class")
    else:
        full = _full_id(env_id)
    if full not in gymnasium.registry:
        raise UnknownEnvError(ENVS.unknown(env_id, _bare_ids()))
    # Without gymnasium's passive checker: after a reset that raised (bad task data) it leaves itself
    # without the reset's output and fails every later step with a TypeError, though the env is fine.
    # The tests run gymnasium's full `check_env` on the built-in envs instead.
    return gymnasium.make(full, disable_env_checker=True, **kwargs)


def _bare_ids() -> list[str]:
    """The ids of sleuth's own namespace without it, so "DocRed-v0" is matched to "DocRead-v0"."""
    prefix = f"{NAMESPACE}/"
    return [n.removeprefix(prefix) for n in ENVS.names() if n.startswith(prefix)]


def registered() -> dict[str, str]:
    """Env ids registered through sleuth (built-in, plugin and user envs) → entry point."""
    return {k: v.entry_point for k, v in registrations().items()}


def registrations() -> dict[str, Registration]:
    return {name: entry.value for name, entry in ENVS.entries().items()}


def load_plugins() -> list[str]:
    """Register the envs that installed packages declare under the `sleuth.envs` entry-point group with
    gymnasium (their modules are imported only when made). A malformed declaration is skipped with a
    warning, never breaking import."""
    import importlib.metadata

    found = []
    for ep in importlib.metadata.entry_points(group=ENV_GROUP):
        if ":" not in ep.value:
            warnings.warn(f"sleuth plugin {ep.name!r} has entry point {ep.value!r}, not 'module:Class'", stacklevel=2)
            continue
        found.append(register(ep.name, ep.value, source=ep.dist.name if ep.dist else "plugin"))
    return found


register("DocRead-v0", "sleuth.envs.docread:DocReadEnv", source="sleuth")
register("Code-v0", "sleuth.envs.code:CodeEnv", source="sleuth")
register("Search-v0", "sleuth.envs.search:SearchEnv", source="sleuth")
register("Remote-v0", "sleuth.envs.remote:RemoteEnv", source="sleuth")
register("SWE-v0", "sleuth.envs.swe:SWEEnv", source="sleuth")
load_plugins()
