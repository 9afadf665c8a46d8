"""Envs, task loaders and verifiers from other installed packages, through entry points."""

import sys
import textwrap

import gymnasium
import pytest

import sleuth
from sleuth.cli import main
from sleuth.envs.registry import load_plugins, registrations
from sleuth.tasks import load_tasks
from sleuth.verifiers.registry import get_verifier


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
    '''))
    info = tmp_path / "acme_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[sleuth.envs]\nacme/Echo-v0 = acme_plugin:EchoEnv\n\n"
        "[sleuth.tasks]\nacme = acme_plugin:load\n\n"
        "[sleuth.verifiers]\nloud = acme_plugin:Loud\n")
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
    assert main(["envs"]) == 0
    assert "acme/Echo-v0" in capsys.readouterr().out


def test_module_colon_class_builds_any_env(hotpot_tasks):
    env = sleuth.make("sleuth.envs.docread:DocReadEnv", budget=1)
    obs, info = env.reset(options={"task": hotpot_tasks[0]})
    assert info["budget"] == 1


def test_broken_plugin_entry_is_skipped_with_a_warning(tmp_path, monkeypatch):
    info = tmp_path / "broken-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[sleuth.envs]\nbad/Env-v0 = no_colon_here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(UserWarning, match="not 'module:Class'"):
        assert "bad/Env-v0" not in load_plugins()


def test_eval_on_a_plugin_env_fails_clearly_for_a_baseline_that_cannot_act(plugin_package, tmp_path, capsys):
    load_plugins()
    argv = ["eval", "--env", "acme/Echo-v0", "--tasks", "acme:test", "--policy", "random", "--out", str(tmp_path)]
    assert main(argv) == 2
    assert "the random baseline reads documents: task acme-0 has none" in capsys.readouterr().err
