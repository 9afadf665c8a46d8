"""docs/contributing.md's four recipes, run as written: each Python block of the page is executed with a throw-away
part (an estimator, an env family, a server, a subcommand), which is then used through the public entry points
and removed again."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import httpx
import pytest

import sleuth
from sleuth.agents.trajectory import Trajectory, Turn

PAGE = (Path(__file__).resolve().parents[1] / "docs" / "contributing.md").read_text()


def block(heading: str) -> str:
    """The Python block under `## heading`."""
    section = PAGE.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)


def test_the_estimator_recipe_registers_one_that_configs_check_by_its_flags():
    from sleuth import rewards
    from sleuth.rewards.episodes import per_episode
    from sleuth.training.config import AgentConfig, AlgorithmConfig, RolloutConfig, TrainConfig

    exec(block("An advantage estimator"), {})
    try:
        def traj(n: int, episode: str, segment: int = 0, segments: int = 1) -> Trajectory:
            return Trajectory("t", "e", [0], turns=[Turn([1] * n, [0.0] * n, "x")], group="g", episode=episode,
                              segment=segment, segments=segments)

        adv = rewards.make("centred_length")([traj(2, "a"), traj(4, "b")], {}).values
        assert [a.tolist() for a in adv] == [[-1.0, -1.0], [1.0, 1.0, 1.0, 1.0]]  # lengths 2, 4: mean 3
        # its flags, read from the class: an agent run may train with it, a group of one may not
        assert TrainConfig(agent=AgentConfig(entrypoint="m:f"), algorithm=AlgorithmConfig(estimator="centred_length"))
        with pytest.raises(ValueError, match="centred_length.*nothing to learn from"):
            TrainConfig(algorithm=AlgorithmConfig(estimator="centred_length"), rollout=RolloutConfig(group_size=1))
        split = per_episode(rewards.make("centred_length"), [traj(2, "a", 0, 2), traj(2, "a", 1, 2), traj(4, "b")], {})
        assert [a.tolist() for a in split.values] == [[-1.0] * 2, [-1.0] * 2, [1.0] * 4]  # one number per episode
    finally:
        rewards.ESTIMATORS.unregister("centred_length")


def test_the_env_family_recipe_makes_envs_the_loop_and_eval_run(tmp_path):
    from sleuth.envs.families import FAMILIES
    from sleuth.envs.outcome import reset_info, step_info

    exec(block("An env family"), {})
    try:
        env = sleuth.make("countdown:any")
        _, info = env.reset(seed=0)
        assert reset_info(info).messages[-1]["content"] == "Say a number; 3 turns left."
        steps = [env.step(a) for a in ("5", "0", "7")]
        assert [s[1] for s in steps] == [0.0, 1.0, 0.0] and [s[2] for s in steps] == [False, False, True]
        assert step_info(steps[0][4]).messages == [{"role": "user", "content": "2 left"}]
        assert step_info(steps[-1][4]).verdict.score == 1.0  # the return, by `TextGameEnv.verdict`
        result = sleuth.evaluate("seeds:0-1", "random-legal", env="countdown:any", out=tmp_path / "eval")
        assert result.summaries[0]["n"] == 2 and not result.failures
    finally:
        FAMILIES.unregister("countdown")


def test_the_server_recipe_is_served_by_sleuth_serve_and_answers_health(monkeypatch):
    from sleuth.cli.main import build_parser
    from sleuth.core.net import in_thread
    from sleuth.servers.base import SERVERS, ServerSpec

    module_code, catalog_code = block("A server").split("# servers/catalog.py")
    echo = types.ModuleType("sleuth.servers.echo")
    exec(module_code, echo.__dict__)
    monkeypatch.setitem(sys.modules, "sleuth.servers.echo", echo)
    exec(catalog_code, {"SERVERS": SERVERS, "ServerSpec": ServerSpec})
    try:
        args = build_parser().parse_args(["serve", "echo", "--times", "2"])
        assert args.port == 8010
        spec = SERVERS.get("echo")
        with in_thread(spec.start(args).app) as url:
            assert httpx.get(f"{url}/health").json() == {"ok": True}
            assert httpx.get(f"{url}/echo", params={"text": "ab"}).json() == {"text": "abab"}
    finally:
        SERVERS.unregister("echo")


def test_the_subcommand_recipe_adds_a_command_with_its_example(monkeypatch, capsys):
    from sleuth.cli import main as cli_main
    from sleuth.cli.args import command
    from sleuth.core.errors import BadInput

    hello = types.ModuleType("hello")
    exec(block("A subcommand"), hello.__dict__)
    monkeypatch.setattr(cli_main, "COMMANDS", (*cli_main.COMMANDS, hello))
    assert cli_main.main(["hello", "--name", "ada"]) == 0
    assert capsys.readouterr().out == "hello ada\n"
    assert "example:\n  sleuth hello --name ada" in cli_main.subcommands(cli_main.build_parser())["hello"].format_help()

    def refuse(args):  # a command that fails the foreseen way: one line, its branch's exit status
        raise BadInput("no such person")

    refusing = types.ModuleType("refusing")
    refusing.register = lambda sub: command(sub, "refuse", refuse, "always refuses", example="sleuth refuse")
    monkeypatch.setattr(cli_main, "COMMANDS", (*cli_main.COMMANDS, refusing))
    assert cli_main.main(["refuse"]) == 2
    assert capsys.readouterr().err.strip() == "error: no such person"


def test_every_server_in_the_catalog_answers_health_the_same_way(tmp_path, hotpot_tasks):
    """The servers sleuth ships, built from their flags as `sleuth serve` builds them (those whose build loads no
    model), each answer GET /health."""
    import sleuth.servers.catalog  # noqa: F401
    from sleuth.cli.main import build_parser
    from sleuth.core.net import in_thread
    from sleuth.envs.retrieval.corpus import Doc
    from sleuth.envs.retrieval.index import build_index, save_index
    from sleuth.servers.base import SERVERS
    from sleuth.tasks.base import write_tasks

    save_index(build_index([Doc("d1", "A", "alpha beta"), Doc("d2", "B", "gamma")], "bm25", "bm25s", progress=False),
               tmp_path / "ix")
    write_tasks(hotpot_tasks[:2], tmp_path / "tasks.jsonl")
    argv = {"retrieval": ["--index", str(tmp_path / "ix")], "env": ["--env", "sleuth/DocRead-v0"],
            "openenv": ["--env", "sleuth/DocRead-v0", "--tasks", str(tmp_path / "tasks.jsonl")],
            "verifier": ["--name", "qa"], "gateway": ["--policy", "random"]}
    assert set(argv) | {"tinker"} == set(SERVERS.names())  # tinker loads a model: tests/test_tinker_server.py
    parser = build_parser()
    for name, flags in argv.items():
        server = SERVERS.get(name).start(parser.parse_args(["serve", name, *flags]))
        try:
            with in_thread(server.app) as url:
                assert httpx.get(f"{url}/health").status_code == 200, name
        finally:
            server.close()
