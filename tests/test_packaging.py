"""The wheel: found packages only (no hand list), no build warnings, and a core install without torch that
scores QA and code records through the verifier adapters."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")
    src = build / "src"  # a copy of the tracked tree: building in place would leave build/ in the checkout
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    for f in files:
        if (ROOT / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, src / f)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # else setuptools warns it
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
                          "-w", str(out), str(src)], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    [whl] = out.glob("sleuth-*.whl")
    return whl, res.stdout + res.stderr


def test_the_wheel_builds_without_warnings_and_holds_the_package_only(wheel):
    whl, log = wheel
    warnings = [line for line in log.splitlines() if "warning" in line.lower() and "pip" not in line.lower()]
    assert not warnings, "\n".join(warnings)
    names = zipfile.ZipFile(whl).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"sleuth", "sleuth-0.1.0.dist-info"}, tops  # never bare `agents`, `verifiers`, `tests`
    for needed in ["sleuth/verifiers/adapters/verl.py", "sleuth/envs/retrieval/bm25.py", "sleuth/synth/swe.py",
                   "sleuth/tasks/swe_sets/toolz-1.2.0.jsonl", "sleuth/training/sync/vllm_ext/sleuth_vllm_ext.py",
                   "sleuth/core/registry.py", "sleuth/cli/main.py"]:
        assert needed in names, needed
    assert "sleuth/setup.py" not in names and not any(n.startswith("sleuth/tests/") for n in names)


CORE_CHECK = r"""
import importlib.util, sys
assert importlib.util.find_spec("torch") is None, "torch is installed in the core venv"
from sleuth.verifiers.adapters.trl import trl_reward
from sleuth.verifiers.adapters.verl import compute_score
from sleuth.verifiers.registry import score
assert score("qa", {"answer": "Denise Levertov"}, "Answer: Denise Levertov") == 1.0
code = "```python\ndef add(a, b):\n    return a + b\n```"
assert score("code", {"test_list": ["assert add(1, 2) == 3"]}, code) == 1.0
assert score("code", {"test_list": ["assert add(1, 2) == 4"]}, code) == 0.0
assert trl_reward("qa")(prompts=["q"], completions=["Answer: Paris"], answer=["Paris"]) == [1.0]
assert compute_score("hotpotqa", "Answer: Paris", "Paris")["score"] == 1.0
import sleuth
env = sleuth.make("DocRead-v0")
assert not [m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "deepspeed")]
print("core ok")
"""


@pytest.mark.slow
def test_a_core_install_scores_records_without_torch(wheel, tmp_path, data_dir):
    """A fresh venv, `pip install <wheel>` with no extras (its dependencies from the configured index)."""
    whl, _ = wheel
    venv = tmp_path / "core"
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        py = str(venv / "bin" / "python")
        # --no-compile: byte-compiling every dependency is most of an install's CPU time, and none of what is tested
        res = subprocess.run([py, "-m", "pip", "install", "-q", "--no-cache-dir", "--no-compile", str(whl)],
                             capture_output=True, text=True, timeout=900)
        assert res.returncode == 0, res.stderr[-3000:]
        res = subprocess.run([py, "-c", CORE_CHECK], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                             env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SLEUTH_DATA")})
        assert res.returncode == 0 and "core ok" in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]
        # the scripted baselines evaluate on DocRead with nothing else installed, and on Search with BM25
        assert "oracle-json | 5 | 1.000" in core_eval(venv, data_dir, tmp_path, "DocRead-v0")
        res = subprocess.run([py, "-m", "pip", "install", "-q", "--no-cache-dir", "--no-compile", f"{whl}[bm25]"],
                             capture_output=True, text=True, timeout=900)
        assert res.returncode == 0, res.stderr[-3000:]
        assert "oracle-json | 5 | 1.000" in core_eval(venv, data_dir, tmp_path, "Search-v0")
    finally:
        shutil.rmtree(venv, ignore_errors=True)  # ~0.4 GB: CI machines run short of disk, not time


def core_eval(venv: Path, data_dir: Path, tmp_path: Path, env: str) -> str:
    """`sleuth eval --policy oracle,lexical` on 5 HotpotQA dev questions in `venv`; its comparison table."""
    out = tmp_path / f"eval-{env}"
    res = subprocess.run([str(venv / "bin" / "sleuth"), "eval", "--env", env, "--policy", "oracle,lexical",
                          "--tasks", "hotpotqa:dev", "--limit", "5", "--out", str(out)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path,
                         env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                              "SLEUTH_DATA": str(data_dir)})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "byte-level ChatML tokenizer" in res.stderr  # no transformers here: the model-less tokenizer
    table = (out / "comparison.md").read_text()
    assert "lexical-json | 5 |" in table, table
    return table
