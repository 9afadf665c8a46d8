"""Env registration through gymnasium's registry, under the `sleuth/` namespace by default, so
`gymnasium.make("sleuth/DocRead-v0")` and `sleuth.make("DocRead-v0")` build the same env. `ENVS` (a
`sleuth.core.registry.Registry`) holds every env id with its entry point and who registered it; gymnasium holds
the env specs.

Plugins: another installed package registers envs through the entry-point group `sleuth.envs`
(name = env id, value = "module:Class"), e.g. in its pyproject.toml:

    [project.entry-points."sleuth.envs"]
    "acme/Sql-v0" = "acme_envs.sql:SqlEnv"

`sleuth.make` reads the group on its first call and imports a plugin's class when its env is made;
`load_plugins()` hands every declared env to gymnasium, for code that calls `gymnasium.make` itself.
`make("module:Class")` also builds any env class directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium

from sleuth.core.registry import Entry, Registry, UnknownNameError, target_of
from sleuth.envs.outcome import ResetInfo

NAMESPACE = "sleuth"
ENV_GROUP = "sleuth.envs"


class UnknownEnvError(UnknownNameError, gymnasium.error.NameNotFound):
    """An env id that is registered neither with sleuth nor with gymnasium."""


# full env id -> the env class or factory (a "module:Class" string until the env is first made)
ENVS: Registry[Callable[..., gymnasium.Env]] = Registry("env", group=ENV_GROUP)


def _full_id(env_id: str) -> str:
    return env_id if "/" in env_id else f"{NAMESPACE}/{env_id}"


def register(env_id: str, entry_point: str | Callable[..., gymnasium.Env], source: str = "user",
             **kwargs: Any) -> str:
    """Register an env (a class, a factory, or a "module:Class" string, imported when first made). Ids
    without a namespace go under `sleuth/`. Registering a taken id with another entry point replaces it,
    with a warning. `kwargs` are the env's default arguments. Returns the full id."""
    full = _full_id(env_id)
    ENVS.register(full, entry_point, source)
    _to_gymnasium(full, entry_point, kwargs)
    return full


def _to_gymnasium(full: str, entry_point: str | Callable[..., gymnasium.Env], kwargs: dict[str, Any]) -> None:
    if full in gymnasium.registry:
        del gymnasium.registry[full]
    gymnasium.register(id=full, entry_point=entry_point, kwargs=kwargs)


def _sync(full: str) -> bool:
    """Give gymnasium the env `ENVS` holds for `full` if gymnasium holds another or none (a plugin's env,
    or a plugin's replacement of a registered one); True if it did."""
    entry = ENVS.entry(full)
    spec = gymnasium.registry.get(full)
    if spec is not None and (spec.entry_point if isinstance(spec.entry_point, str)
                             else target_of(spec.entry_point)) == entry.target:
        return False
    _to_gymnasium(full, entry.target, {})
    return True


def make(env_id: str, **kwargs: Any) -> gymnasium.Env:
    """`gymnasium.make` with the `sleuth/` namespace implied; `FAMILY:ID` builds an env of a foreign family
    (`envs/families`: gem, reasoning_gym, textarena, ...); "package.module:Class" builds that class."""
    from sleuth.envs.families import make_family_env, near_family, split_id

    if split_id(env_id):
        try:
            return make_family_env(env_id, **kwargs)
        except UnknownNameError as e:
            raise UnknownEnvError(str(e)) from None
    family = near_family(env_id)
    if family:
        raise UnknownEnvError(f"unknown env family {env_id.partition(':')[0]!r} in {env_id!r} (did you mean "
                              f"{family!r}?)")
    if ":" in env_id and "/" not in env_id:
        module, _, cls = env_id.partition(":")
        full = _full_id(f"{module}.{cls}")
        if full not in ENVS:
            register(full, env_id, source="module:Class")
    else:
        full = _full_id(env_id)
    try:
        ENVS.get(full)  # imported here: an env that does not import fails with its id and who declared it
    except UnknownNameError:
        if full not in gymnasium.registry:  # gymnasium's own envs are made too
            raise UnknownEnvError(ENVS.unknown(env_id, _bare_ids())) from None
    else:
        _sync(full)
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
    return {k: v.target for k, v in registrations().items()}


def registrations() -> dict[str, Entry]:
    """Env ids → entry point and who registered it; no env is imported."""
    return ENVS.entries()


def load_plugins() -> list[str]:
    """Give gymnasium every env that installed packages declare under `sleuth.envs` (each is imported
    when made), so `gymnasium.make` and `gymnasium.make_vec` know them; returns the ids it gave."""
    ENVS.load_entry_points(again=True)  # packages installed since the first lookup
    return [full for full in ENVS.names() if _sync(full)]


register("DocRead-v0", "sleuth.envs.docread:DocReadEnv", source="sleuth")
register("Code-v0", "sleuth.envs.code:CodeEnv", source="sleuth")
register("Search-v0", "sleuth.envs.search:SearchEnv", source="sleuth")
register("Remote-v0", "sleuth.envs.remote:RemoteEnv", source="sleuth")
register("SWE-v0", "sleuth.envs.swe:SWEEnv", source="sleuth")


def oracle_of(start: ResetInfo) -> Callable[..., Any]:
    """The `oracle(task, turn, start)` of the env an episode runs in, found by the class its reset names
    (`ResetInfo.env`, `ToolEnv.entry_point`), also for an env served elsewhere: what the scripted `oracle`
    policy plays. The env layer resolves its own entry points, as `make` does."""
    from gymnasium.envs.registration import load_env_creator

    from sleuth.envs.base import ToolEnv
    from sleuth.envs.families.base import TextGameEnv

    if start.env is None or ":" not in start.env:
        raise ValueError(f"the oracle plays the env's own oracle (`ToolEnv.oracle`): the reset names no env class "
                         f"(ResetInfo.env 'module:Class'; got {start.env!r}); only a ToolEnv's or a TextGameEnv's "
                         "reset gives one")
    cls = load_env_creator(start.env)
    if not (isinstance(cls, type) and issubclass(cls, (ToolEnv, TextGameEnv))):
        raise TypeError(f"{start.env} is neither a ToolEnv nor a TextGameEnv class: the oracle needs its `oracle` hook")
    return cls.oracle
