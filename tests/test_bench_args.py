"""The ablation's arguments are checked before any arm trains: a typo fails at once, with the key or arm named."""

import subprocess
import sys
from pathlib import Path

ABLATE = Path(__file__).resolve().parents[1] / "bench" / "ablate.py"


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


def test_the_speed_benchmarks_levers_off_reach_the_parts_that_act_on_them(tiny_model_dir):
    """bench/recipe_speed.py's `switches off` arm patches its own process: the update's head over every
    position, every prompt prefilled, lock-step rounds. Checked in a fresh process, as the arm runs."""
    code = f"""
import sys
sys.path.insert(0, {str(ABLATE.parent)!r})
import recipe_speed
from sleuth.agents.loop import episodes as loop
from sleuth.agents.policies import hf
recipe_speed.levers_off()
from sleuth.training.rl.forward import ScoredForward
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained({str(tiny_model_dir)!r})
assert ScoredForward(m, m).full_logits is True
assert hf.TransformersPolicy({str(tiny_model_dir)!r}, device="cpu").share_prefill is False
seen = {{}}
loop.run_episodes = lambda *args, **kwargs: seen.update(kwargs)
recipe_speed.levers_off()
loop.run_episodes(None, [], None)
assert seen == {{"lockstep": True}}, seen
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]
