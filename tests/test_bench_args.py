"""The ablation's arguments are checked before any arm trains: a typo fails at once, with the key or arm named."""

import subprocess
import sys
from pathlib import Path

ABLATE = Path(__file__).resolve().parents[1] / "experiments" / "ablate.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ABLATE), *args], capture_output=True, text=True, timeout=120)


def test_a_misspelt_recipe_key_is_refused_with_a_suggestion(tmp_path):
    proc = run("--set", "rollout.grop_size=8", "--out", str(tmp_path / "ablate"))
    assert proc.returncode == 2
    assert "unknown config key 'rollout.grop_size'" in proc.stderr and "did you mean 'group_size'" in proc.stderr
    assert not (tmp_path / "ablate").exists()  # nothing trained, nothing written


def test_a_set_without_a_value_is_refused(tmp_path):
    proc = run("--set", "rollout.group_size", "--out", str(tmp_path / "ablate"))
    assert proc.returncode != 0 and "--set wants KEY=VALUE" in proc.stderr
    assert not (tmp_path / "ablate").exists()


def test_an_unknown_arm_is_refused(tmp_path):
    proc = run("--only", "grpo,info_gain/gold_prob@lexical", "--out", str(tmp_path / "ablate"))
    assert proc.returncode == 2 and "unknown arm(s) ['info_gain/gold_prob@lexical']" in proc.stderr


