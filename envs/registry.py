"""Env registration through gymnasium's registry, under the `sleuth/` namespace by default, so
`gymnasium.make("sleuth/DocRead-v0")` and `sleuth.make("DocRead-v0")` build the same env."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium

NAMESPACE = "sleuth"
_OURS: dict[str, str] = {}  # env id -> where it came from (entry point)


def _full_id(env_id: str) -> str:
    return env_id if "/" in env_id else f"{NAMESPACE}/{env_id}"


def register(env_id: str, entry_point: str | Callable[..., gymnasium.Env], **kwargs: Any) -> str:
    """Register an env (a class, a factory, or a "module:Class" string). Ids without a namespace go under
    `sleuth/`. Re-registering an id replaces it. Returns the full id."""
    full = _full_id(env_id)
    if full in gymnasium.registry:
        del gymnasium.registry[full]
    # gymnasium's passive checker is kept: our Text spaces accept any string, so it checks for real.
    gymnasium.register(id=full, entry_point=entry_point, kwargs=kwargs)
    _OURS[full] = entry_point if isinstance(entry_point, str) else f"{entry_point.__module__}:{entry_point.__qualname__}"
    return full


def make(env_id: str, **kwargs: Any) -> gymnasium.Env:
    """`gymnasium.make` with the `sleuth/` namespace implied."""
    full = _full_id(env_id)
    if full not in gymnasium.registry:
        raise gymnasium.error.NameNotFound(f"no env {full!r}; registered: {', '.join(registered())}")
    return gymnasium.make(full, **kwargs)


def registered() -> dict[str, str]:
    """Env ids registered through sleuth (built-in and user envs) → entry point."""
    return dict(sorted(_OURS.items()))


register("DocRead-v0", "sleuth.envs.docread:DocReadEnv")
register("Code-v0", "sleuth.envs.code:CodeEnv")
register("Search-v0", "sleuth.envs.search:SearchEnv")
register("Remote-v0", "sleuth.envs.remote:RemoteEnv")
