"""docs/getting-started.md is a contract with a newcomer: every block runs here, in order and as written, in a
fresh directory with the installed `sleuth` on PATH (the one block marked not-run is `make setup`, which `make
test` runs before this test). A block after `<!-- file: NAME -->` is written to NAME; a bash block is run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "getting-started.md"
BLOCK = re.compile(r"(?:<!-- (file|not-run): ?([^>]*?) -->\n)?```(\w+)\n(.*?)\n```", re.S)


def blocks() -> list[tuple[str | None, str, str, str]]:
    """(marker, its argument, language, body) of every fenced block, in page order."""
    return [(m.group(1), m.group(2), m.group(3), m.group(4)) for m in BLOCK.finditer(PAGE.read_text())]


def test_the_page_is_made_of_blocks_this_test_knows_how_to_run():
    found = blocks()
    assert len(found) >= 9
    assert [b for b in found if b[0] == "not-run"] == [found[0]] and "make setup" in found[0][3]
    for marker, _, lang, _ in found[1:]:
        assert lang == "bash" or marker == "file", f"a {lang} block that is neither run nor written to a file"


@pytest.mark.long
@pytest.mark.slow
def test_every_block_runs_as_written(tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for marker, arg, _, body in blocks():
        if marker == "not-run":
            continue
        if marker == "file":
            (tmp_path / arg).write_text(body + "\n")
            continue
        out = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=900)
        assert out.returncode == 0, f"{body}\n--- stdout\n{out.stdout[-3000:]}\n--- stderr\n{out.stderr[-3000:]}"
    runs = tmp_path / "runs" / "gs"
    assert json.loads((runs / "eval" / "smollm2-text" / "summary.json").read_text())["n"] == 3
    assert (runs / "compare" / "compare.md").is_file()
    oracle = json.loads((runs / "calc-oracle" / "summary.json").read_text())
    assert oracle["n"] == 40 and oracle["score"] == 1.0
    assert (runs / "calc-train" / "hf" / "config.json").is_file() and (runs / "calc-train" / "training.png").is_file()
    assert len((runs / "calc-train" / "metrics.jsonl").read_text().splitlines()) == 2
    assert json.loads((runs / "calc-trained" / "summary.json").read_text())["n"] == 4
