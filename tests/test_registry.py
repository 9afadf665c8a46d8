"""One registry idiom: did-you-mean, override warnings, entry points read once, for every extension point."""

import importlib.metadata
import warnings

import gymnasium
import pytest

from sleuth.registry import Registry, UnknownNameError


def test_get_names_and_did_you_mean():
    reg = Registry("widget")
    reg.register("alpha", 1)
    reg.register("beta", 2)
    assert reg.get("beta") == 2 and reg.names() == ["alpha", "beta"] and "alpha" in reg and len(reg) == 2
    with pytest.raises(UnknownNameError,
                       match=r"unknown widget 'alpah' \(did you mean 'alpha'\?\); known: alpha, beta"):
        reg.get("alpah")
    with pytest.raises(ValueError, match="known: alpha, beta$"):  # nothing close: no hint, still the list
        reg.get("zzzzzz")


def test_override_warns_and_same_value_does_not():
    reg = Registry("widget")
    reg.register("a", 1, "sleuth")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reg.register("a", 1, "sleuth")  # the same registration again (a re-import): silent
    with pytest.warns(UserWarning, match="widget 'a' registered by me replaces the one from sleuth"):
        reg.register("a", 2, "me")
    assert reg.entry("a").value == 2 and reg.entry("a").source == "me"


class _EP:
    """An entry point as importlib.metadata gives it (name, value, dist, load)."""

    def __init__(self, name, value, loads):
        self.name, self.value, self._loads = name, value, loads
        self.dist = type("Dist", (), {"name": "acme"})()

    def load(self):
        self._loads.append(self.name)
        if self.value == "boom":
            raise RuntimeError("no such module")
        return self.value


def test_entry_points_read_once_imported_on_first_use_and_broken_ones_named(monkeypatch):
    scans, loads = [], []

    def entry_points(group):
        scans.append(group)
        return [_EP("plug", "value", loads), _EP("broken", "boom", loads)]

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    reg = Registry("widget", group="acme.widgets")
    reg.register("builtin", 0, "sleuth")
    assert reg.names() == ["broken", "builtin", "plug"] and loads == []  # listed without importing
    assert reg.get("plug") == "value" and reg.entry("plug").source == "acme"
    assert reg.get("plug") == "value" and loads == ["plug"] and scans == ["acme.widgets"]
    with pytest.raises(ImportError, match="widget 'broken' that acme declares \\(boom\\) does not load"):
        reg.get("broken")
    with pytest.raises(UnknownNameError):
        reg.get("later")  # a miss reads the group again, for a package installed since
    assert scans == ["acme.widgets", "acme.widgets"]


@pytest.mark.parametrize(("lookup", "typo", "hint"), [
    ("env", "DocRed-v0", "DocRead-v0"),
    ("estimator", "grpoo", "grpo"),
    ("verifier", "qaa", "qa"),
    ("tasks", "hotpot", "hotpotqa"),
    ("parser", "jsn", "json"),
])
def test_every_extension_point_says_did_you_mean(lookup, typo, hint):
    import sleuth
    from sleuth import rewards
    from sleuth.envs.parsers import get_parser
    from sleuth.tasks import load_tasks
    from sleuth.verifiers.registry import get_verifier

    call = {"env": sleuth.make, "estimator": rewards.make, "verifier": get_verifier,
            "tasks": lambda name: load_tasks(f"{name}:test"), "parser": get_parser}[lookup]
    with pytest.raises(UnknownNameError, match=f"did you mean '{hint}'"):
        call(typo)


def test_an_unknown_env_is_still_gymnasiums_error():
    import sleuth

    with pytest.raises(gymnasium.error.NameNotFound):
        sleuth.make("Nope-v9")
