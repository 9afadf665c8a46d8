"""`make run` ends with `sleuth summary runs/main`: built here from real eval runs laid out as the Makefile lays
them out (scripted policies stand in the models' folders, so the expected differences are known: the oracle
reads and answers every question, `random` almost none), with stage times recorded by the Makefile's timer."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sleuth.agents.eval.compare import compare
from sleuth.cli.main import main

REPO = Path(__file__).resolve().parents[1]
LIMIT = "8"


def _eval(policy: str, tasks: str, out: Path) -> None:
    assert main(["eval", "--env", "sleuth/DocRead-v0", "--tasks", tasks, "--limit", LIMIT, "--policy", policy,
                 "--harness", "text", "--out", str(out)]) == 0


def _timed(log: Path, stage: str, *command: str) -> int:
    return subprocess.call([sys.executable, str(REPO / "install" / "timed.py"), str(log), stage, "--", *command])


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("main")
    assert main(["eval", "--env", "sleuth/DocRead-v0", "--tasks", "hotpotqa:test", "--limit", LIMIT,
                 "--policy", "oracle,lexical,random", "--harness", "text", "--out", str(run)]) == 0
    _eval("random", "hotpotqa:test", run / "smollm2-text")        # "untrained"
    _eval("first-k", "hotpotqa:test", run / "sft-text")           # "warm start"
    _eval("oracle", "hotpotqa:test", run / "trained-text")        # "RL"
    _eval("random", "musique:dev", run / "musique-untrained")
    _eval("oracle", "musique:dev", run / "musique-trained")
    return run


def test_timer_records_each_stage_and_passes_its_exit_status_through(tmp_path):
    log = tmp_path / "stages.jsonl"
    assert _timed(log, "sft", sys.executable, "-c", "pass") == 0
    assert _timed(log, "rl-train", sys.executable, "-c", "import sys; sys.exit(3)") == 3
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["stage"], r["rc"]) for r in records] == [("sft", 0), ("rl-train", 3)]
    assert all(r["seconds"] >= 0 for r in records)
    assert _timed(log, "bad") == 2  # no `--`: a usage error, nothing run


def test_summary_holds_every_model_the_paired_cis_and_the_stage_times(run_dir, capsys):
    log = run_dir / "stages.jsonl"
    _timed(log, "rl-train", sys.executable, "-c", "import time; time.sleep(0.3)")
    _timed(log, "rl-train", sys.executable, "-c", "pass")  # a resumed make run: its last record counts
    assert main(["summary", str(run_dir)]) == 0
    text = (run_dir / "summary.md").read_text()
    assert capsys.readouterr().out.startswith(text)
    assert (run_dir / "summary.png").stat().st_size > 10_000
    for label in ("oracle (reads the gold documents)", "lexical (rule, no model)", "random (rule)",
                  "SmolLM2, untrained", "warm start (SFT)", "RL (CIGPO from the warm start)"):
        assert f"| {label} |" in text
    assert "Not run yet: `first-k-text`." in text  # the one folder this layout lacks, named, not guessed
    # the paired rows are compare()'s own numbers, judged by their CI
    rl_vs_untrained = {r["metric"]: r for r in compare(run_dir / "smollm2-text", run_dir / "trained-text")["rows"]}
    f1 = rl_vs_untrained["f1"]
    assert f1["ci_low"] > 0
    assert (f"| RL vs untrained | answer F1 | {f1['n']} | {f1['a']:.3f} | {f1['b']:.3f} | {f1['diff']:+.3f} | "
            f"[{f1['ci_low']:+.3f}, {f1['ci_high']:+.3f}] | higher |") in text
    assert "**RL vs untrained, MuSiQue**: answer F1 higher" in text
    stage_rows = [line for line in text.splitlines() if line.startswith("| rl-train |")]
    assert stage_rows == ["| rl-train | 0.0 | 0 |"]
    assert f"`{run_dir / 'rl-vs-warm-start/compare.md'}`" not in text  # only reports that exist are listed
    assert f"`{run_dir / 'comparison.md'}`" in text


def test_no_difference_is_reported_as_not_shown(tmp_path):
    for name in ("smollm2-text", "sft-text"):
        _eval("oracle", "hotpotqa:test", tmp_path / name)
    assert main(["summary", str(tmp_path)]) == 0
    text = (tmp_path / "summary.md").read_text()
    assert "**warm start vs untrained**: answer F1 no difference shown (1.000 → 1.000, +0.000" in text


def test_a_missing_run_directory_is_one_line_and_a_nonzero_exit(tmp_path, capsys):
    assert main(["summary", str(tmp_path / "nope")]) != 0
    assert capsys.readouterr().err.count("\n") == 1


def test_the_summary_reads_the_folders_the_makefile_writes():
    from sleuth.agents.eval.run_summary import MUSIQUE, PAIRS, TEST

    recipe = (REPO / "Makefile").read_text().split("\nrun: setup\n", 1)[1].split("\n\n", 1)[0]
    written = set(re.findall(r"--out runs/main/([\w-]+)", recipe))
    policies = re.search(r"--policy ([\w,-]+) \\\n\t\t--harness text --out runs/main\n", recipe).group(1).split(",")
    written |= {f"{p}-text" for p in policies}  # one eval of several policies: a folder per policy
    read = {m.folder for m in (*TEST, *MUSIQUE)} | {f for p in PAIRS for f in (p.a, p.b)}
    assert read <= written, read - written
    assert "sleuth summary runs/main" in recipe.splitlines()[-1]
