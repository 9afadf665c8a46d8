"""`sleuth --version`, `sleuth doctor`, and the example every subcommand's --help ends with."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

from sleuth.cli.args import subcommands
from sleuth.cli.main import build_parser


def test_every_subcommand_shows_an_example_that_its_parser_accepts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLEUTH_DATA", str(tmp_path))
    parser = build_parser()
    commands = subcommands(parser)
    assert {"eval", "serve tinker", "serve gateway", "train", "index build", "doctor"} <= set(commands)
    for name, sub in commands.items():  # every subcommand is made by `cli.args.command`, with its example
        example = sub.epilog.split("example:\n  ", 1)[1].splitlines()[0] if sub.epilog else None
        assert example, f"sleuth {name} --help shows no example"
        assert f"example:\n  {example}" in sub.format_help(), name
        words = shlex.split(os.path.expandvars(example))
        assert words[0] == "sleuth" and " ".join(words[1:1 + len(name.split())]) == name
        assert parser.parse_args(words[1:]).fn is not None  # every flag it shows exists


def _sleuth(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sleuth.cli", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_version():
    from importlib.metadata import version

    out = _sleuth("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"sleuth {version('sleuth')}"


def test_doctor_names_what_is_missing_and_the_command_that_adds_it(tmp_path):
    ok = _sleuth("doctor")
    lines = {line.split()[0] for line in ok.stdout.splitlines()}
    assert {"Python", "torch", "bubblewrap", "embedded", "data", "vLLM", "Ray", "GPUs"} <= lines
    gone = _sleuth("doctor", env={"SLEUTH_DATA": str(tmp_path / "nowhere")})
    assert gone.returncode == 1
    row = next(line for line in gone.stdout.splitlines() if line.startswith("data directory"))
    assert "MISSING" in row and "export SLEUTH_DATA=" in row
    assert gone.stdout.splitlines()[-1] == "the main job needs: data directory"
