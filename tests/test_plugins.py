"""Envs, task loaders and verifiers from other installed packages, through entry points."""

import subprocess
import sys
import textwrap

import gymnasium
import pytest

import sleuth
from sleuth.cli.main import main
from sleuth.envs.outcome import reset_info
from sleuth.envs.registry import ENVS, load_plugins, registrations
from sleuth.tasks import load_tasks
from sleuth.verifiers.registry import VERIFIERS, get_verifier, score


@pytest.fixture
def plugin_package(tmp_path, monkeypatch):
    """A real installed distribution on sys.path: a module plus its dist-info with entry points."""
    (tmp_path / "acme_plugin.py").write_text(textwrap.dedent('''
        from sleuth import ToolEnv, Task, Verdict, tool

        class EchoEnv(ToolEnv):
            def default_verifier(self):
                return lambda task, response, **_: Verdict(float(response == task.answer))

            @tool(final=True)
            def say(self, text: str) -> str:
                """Say it."""
                return text

        def load(path, split):
            return [Task(id=f"acme-{i}", question="say hi", answer="hi", split=split) for i in range(3)]

        class Loud:
            def __call__(self, task, response, **_):
                return Verdict(float(response.isupper()))

        def last_word(text):
            return text.split()[-1]
    '''))
    info = tmp_path / "acme_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[sleuth.envs]\nacme/Echo-v0 = acme_plugin:EchoEnv\n\n"
        "[sleuth.tasks]\nacme = acme_plugin:load\n\n"
        "[sleuth.verifiers]\nloud = acme_plugin:Loud\n\n"
        "[sleuth.extractors]\nloud = acme_plugin:last_word\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "data").mkdir()
    monkeypatch.setenv("SLEUTH_DATA", str(tmp_path / "data"))
    yield
    sys.modules.pop("acme_plugin", None)


def test_plugin_env_task_loader_and_verifier(plugin_package, capsys):
    assert "acme/Echo-v0" in load_plugins()
    assert registrations()["acme/Echo-v0"].source == "acme-plugin"
    env = gymnasium.make("acme/Echo-v0")
    tasks = load_tasks("acme:test")
    assert [t.id for t in tasks] == ["acme-0", "acme-1", "acme-2"]
    env.reset(options={"task": tasks[0]})
    _, reward, terminated, *_ = env.step('<tool_call>{"name": "say", "arguments": {"text": "hi"}}</tool_call>')
    assert terminated and reward == 1.0
    assert get_verifier("loud")({}, "HEY").score == 1.0
    assert score("loud", {}, "whisper HEY") == 1.0  # the plugin's extractor picks the last word
    assert score("loud", {}, "whisper HEY", extract=False) == 0.0
    assert main(["envs"]) == 0
    assert "acme/Echo-v0" in capsys.readouterr().out


def test_module_colon_class_builds_any_env(hotpot_tasks):
    env = sleuth.make("sleuth.envs.docread:DocReadEnv", budget=1)
    obs, info = env.reset(options={"task": hotpot_tasks[0]})
    assert reset_info(info).budget == 1


def test_a_broken_plugin_costs_only_its_own_names(tmp_path, monkeypatch):
    info = tmp_path / "broken-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[sleuth.envs]\nbad/Env-v0 = no_such_module:Env\n\n"
                                           "[sleuth.verifiers]\nbroken = no_such_module:Verifier\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert "bad/Env-v0" in load_plugins()  # declared, listed, not imported
        assert registrations()["bad/Env-v0"].source == "broken"
        with pytest.raises(ImportError, match=r"env 'bad/Env-v0' that broken declares \(no_such_module:Env\) does "
                                              "not load: ModuleNotFoundError"):
            sleuth.make("bad/Env-v0")
        with pytest.raises(ImportError, match="verifier 'broken' that broken declares"):
            get_verifier("broken")
        sleuth.make("DocRead-v0").close()
        assert get_verifier("qa")({"answer": "x"}, "x").score == 1.0
    finally:
        ENVS.unregister("bad/Env-v0")
        VERIFIERS.unregister("broken")
        gymnasium.registry.pop("bad/Env-v0", None)


def test_importing_sleuth_reads_no_entry_point():
    """Plugins are read on the first lookup of a registry, not at import."""
    code = ("import importlib.metadata as m\n"
            "groups, real = [], m.entry_points\n"
            "m.entry_points = lambda **kw: groups.append(kw.get('group')) or real(**kw)\n"
            "import sleuth, sleuth.agents.policies.load, sleuth.envs.parsers, sleuth.tasks, sleuth.verifiers.registry\n"
            "print([g for g in groups if g and g.startswith('sleuth.')])\n"
            "sleuth.make('DocRead-v0')\n"
            "print([g for g in groups if g and g.startswith('sleuth.')])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    before, after = out.splitlines()
    assert before == "[]" and "'sleuth.envs'" in after


def test_serve_verifier_takes_a_plugin_verifier_and_refuses_an_unknown_name(plugin_package, monkeypatch, capsys):
    import sleuth.servers.base as base

    served = []
    monkeypatch.setattr(base, "run", lambda server, host, port: served.append(server.banner))
    assert main(["serve", "verifier", "--name", "loud", "--port", "0"]) == 0
    assert served == ["serving the loud verifier on {url}"]
    assert main(["serve", "verifier", "--name", "lod", "--port", "0"]) == 2 and len(served) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown verifier 'lod' (did you mean 'loud'?)" in err


def test_eval_on_a_plugin_env_fails_clearly_for_a_baseline_that_cannot_act(plugin_package, tmp_path, capsys):
    load_plugins()
    argv = ["eval", "--env", "acme/Echo-v0", "--tasks", "acme:test", "--policy", "random", "--out", str(tmp_path)]
    assert main(argv) == 2
    assert "the random baseline reads documents: task acme-0 has none" in capsys.readouterr().err
