"""Env registration through gymnasium's registry, under the `sleuth/` namespace by default, so
`gymnasium.make("sleuth/DocRead-v0")` and `sleuth.make("DocRead-v0")` build the same env.

Plugins: another installed package registers envs through the entry-point group `sleuth.envs`
(name = env id, value = "module:Class"), e.g. in its pyproject.toml:

    [project.entry-points."sleuth.envs"]
    "acme/Sql-v0" = "acme_envs.sql:SqlEnv"

They are registered when sleuth is imported. `make("module:Class")` also builds any env class directly.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium

NAMESPACE = "sleuth"
ENV_GROUP = "sleuth.envs"


@dataclass(frozen=True)
class Registration:
    entry_point: str
    source: str  # the distribution that registered it ("sleuth", a plugin's name, or "user")


_OURS: dict[str, Registration] = {}


def _full_id(env_id: str) -> str:
    return env_id if "/" in env_id else f"{NAMESPACE}/{env_id}"


def register(env_id: str, entry_point: str | Callable[..., gymnasium.Env], source: str = "user",
             **kwargs: Any) -> str:
    """Register an env (a class, a factory, or a "module:Class" string). Ids without a namespace go under
    `sleuth/`. Re-registering an id replaces it. Returns the full id."""
    full = _full_id(env_id)
    if full in gymnasium.registry:
        del gymnasium.registry[full]
    gymnasium.register(id=full, entry_point=entry_point, kwargs=kwargs)
    where = entry_point if isinstance(entry_point, str) else f"{entry_point.__module__}:{entry_point.__qualname__}"
    _OURS[full] = Registration(where, source)
    return full


def make(env_id: str, **kwargs: Any) -> gymnasium.Env:
    """`gymnasium.make` with the `sleuth/` namespace implied; "package.module:Class" builds that class."""
    if ":" in env_id and "/" not in env_id:
        module, _, cls = env_id.partition(":")
        full = register(f"{module}.{cls}", env_id, source="module:Class")
    else:
        full = _full_id(env_id)
    if full not in gymnasium.registry:
        raise gymnasium.error.NameNotFound(f"no env {full!r}; registered: {', '.join(registered())}")
    # Without gymnasium's passive checker: after a reset that raised (bad task data) it leaves itself
    # without the reset's output and fails every later step with a TypeError, though the env is fine.
    # The tests run gymnasium's full `check_env` on the built-in envs instead.
    return gymnasium.make(full, disable_env_checker=True, **kwargs)


def registered() -> dict[str, str]:
    """Env ids registered through sleuth (built-in, plugin and user envs) → entry point."""
    return {k: v.entry_point for k, v in sorted(_OURS.items())}


def registrations() -> dict[str, Registration]:
    return dict(sorted(_OURS.items()))


def load_plugins() -> list[str]:
    """Register the envs that installed packages declare under the `sleuth.envs` entry-point group.
    A plugin that fails to declare itself properly is skipped with a warning, never breaking import."""
    import warnings

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
