"""One registry idiom: did-you-mean, override warnings, entry points read once, for every extension point."""

import importlib.metadata
import sys
import warnings

import gymnasium
import pytest

from sleuth.core.registry import Registry, UnknownNameError


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
    assert reg.get("a") == 2 and reg.entry("a").source == "me"


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


def test_a_module_attr_string_is_imported_on_first_lookup(tmp_path, monkeypatch):
    (tmp_path / "lazy_widget.py").write_text("class Widget:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lazy_widget", raising=False)
    reg = Registry("widget")
    reg.register("lazy", "lazy_widget:Widget", "sleuth")
    reg.register("missing", "no_such_module:Widget", "sleuth")
    assert reg.names() == ["lazy", "missing"] and reg.entry("lazy").target == "lazy_widget:Widget"
    assert "lazy_widget" not in sys.modules  # listed and described without importing
    widget = reg.get("lazy")
    assert widget.__name__ == "Widget" and "lazy_widget" in sys.modules and reg.get("lazy") is widget
    with pytest.raises(ImportError, match=r"widget 'missing' that sleuth declares \(no_such_module:Widget\)"):
        reg.get("missing")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reg.register("lazy", "lazy_widget:Widget", "sleuth")  # the same string again: silent, still imported
        reg.register("lazy", widget, "sleuth")  # the object that string names: the same registration
    assert reg.get("lazy") is widget
    with pytest.warns(UserWarning, match="replaces"):
        reg.register("lazy", "lazy_widget:Other", "me")
    with pytest.raises(ValueError, match="neither a component nor 'module:attr'"):
        reg.register("bad", "no colon")


def test_every_registry_is_filled_by_register_with_objects_or_strings():
    """Each of sleuth's registries lists its built-in names from `register` calls, plugins' beside them."""
    from sleuth.agents.policies.load import SCRIPTED_POLICIES
    from sleuth.envs.registry import ENVS
    from sleuth.rewards import ESTIMATORS
    from sleuth.verifiers.registry import EXTRACTORS, VERIFIERS

    assert {"oracle", "lexical", "random", "noop"} <= set(SCRIPTED_POLICIES.names())
    assert SCRIPTED_POLICIES.entry("oracle").target == "sleuth.agents.policies.scripted:Oracle"
    assert ENVS.entry("sleuth/DocRead-v0").target == "sleuth.envs.docread:DocReadEnv"
    assert {"qa", "code", "swe"} <= set(VERIFIERS.names()) and {"qa", "code", "swe"} <= set(EXTRACTORS.names())
    assert {"grpo", "rloo", "gigpo", "gear_mix"} <= set(ESTIMATORS.names())
