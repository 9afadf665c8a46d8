"""Inbound env families: environments of other libraries, made by id `FAMILY:ID`, through sleuth's Env contract
(`sleuth.make("gem:game:Sudoku-v0-easy")`). Each family is one module, imported (with its library) only when
one of its envs is made. Plugins add families through the entry-point group `sleuth.env_families`
(name = family, value = "module:attr" of an `EnvFamily`).

GEM, TextArena and reasoning-gym ids may name the user's module that registers them, as `openenv:MODULE:Class`
names the module that defines its class: `gem:MODULE:ID` imports MODULE (whose `gem.register(...)`, TextArena
`register(...)` or `register_dataset(...)` runs at import, as those libraries' docs write it), then makes ID."""

from __future__ import annotations

import difflib
from typing import Any

import gymnasium

from sleuth.core.registry import Registry, UnknownNameError, import_target
from sleuth.envs.families.base import FREE, EnvFailure, EnvFamily, MissingExtraError, Move, TextGameEnv, user_id

FAMILIES: Registry[EnvFamily] = Registry("env family", group="sleuth.env_families")
FAMILIES.register("reasoning_gym", EnvFamily("reasoning_gym", "sleuth.envs.families.reasoning_gym:make",
                                             "sleuth.envs.families.reasoning_gym:dataset_names", modules=True),
                  "sleuth")
FAMILIES.register("gem", EnvFamily("gem", "sleuth.envs.families.gem:make", "sleuth.envs.families.gem:env_ids",
                                   modules=True), "sleuth")
FAMILIES.register("textarena", EnvFamily("textarena", "sleuth.envs.families.textarena:make",
                                         "sleuth.envs.families.textarena:env_ids", modules=True), "sleuth")
# OpenEnv ids are open-ended (a module path or a server's URL): nothing to list, nothing to match.
FAMILIES.register("openenv", EnvFamily("openenv", "sleuth.envs.families.openenv:make", harness="json"), "sleuth")
# verifiers ids are modules its loader imports (in its own venv): nothing to list; seeds are rows of the taskset.
FAMILIES.register("verifiers", EnvFamily("verifiers", "sleuth.envs.families.verifiers_env:make", harness="json",
                                         rows=True), "sleuth")
# BFCL v4: an env per category (and `all`); its episodes are BFCL items (`--tasks bfcl:...`), not seeds.
FAMILIES.register("bfcl", EnvFamily("bfcl", "sleuth.envs.families.bfcl:make", "sleuth.envs.families.bfcl:env_ids",
                                    seeded=False, harness="json"), "sleuth")


def split_id(env_id: str) -> tuple[str, str] | None:
    """(family, id) for a `FAMILY:ID` whose family is registered, else None."""
    family, sep, rest = env_id.partition(":")
    return (family, rest) if sep and family in FAMILIES else None


def family_of(env_id: str) -> EnvFamily | None:
    parts = split_id(env_id)
    return FAMILIES.get(parts[0]) if parts else None


def near_family(env_id: str) -> str | None:
    """The registered family a mistyped `FAMILY:ID` prefix probably meant (`reasoning-gym` → `reasoning_gym`)."""
    prefix = env_id.partition(":")[0]
    close = difflib.get_close_matches(prefix.replace("-", "_").lower(), FAMILIES.names(), n=1, cutoff=0.75)
    return close[0] if close and close[0] != prefix else None


def _resolve(target: Any) -> Any:
    return import_target(target) if isinstance(target, str) else target


def make_family_env(env_id: str, **env_args: Any) -> gymnasium.Env:
    """Build `FAMILY:ID`; an id the family does not know is `UnknownNameError` with the closest one."""
    family_name, inner = split_id(env_id) or ("", "")
    family = FAMILIES.get(family_name)
    if family.ids is not None:
        ids = _resolve(family.ids)()
        named = user_id(inner) if family.modules and inner not in ids else None  # `MODULE:ID`: importing registers ID
        if named is not None:
            ids = _resolve(family.ids)()
        if inner not in ids and named not in ids:
            close = difflib.get_close_matches(named or inner, ids, n=1)
            where = f"{inner.partition(':')[0]}:" if named is not None else ""
            hint = f" (did you mean '{family_name}:{where}{close[0]}'?)" if close else ""
            raise UnknownNameError(f"unknown {family_name} env {env_id!r}{hint}; {family_name} has {len(ids)} ids")
    return _resolve(family.make)(inner, **env_args)


__all__ = ["FAMILIES", "FREE", "EnvFailure", "EnvFamily", "MissingExtraError", "Move", "TextGameEnv", "family_of",
           "make_family_env", "near_family", "split_id"]
