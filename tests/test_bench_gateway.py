"""bench/gateway.py's arguments: bad values are refused at once (nothing loads, nothing is written), `--quick`
gives the small sizes that explicit flags override, and the sections default to all."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "gateway.py"


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)


def test_bad_sizes_and_sections_are_refused_before_anything_runs(tmp_path):
    for args, said in ((["--tasks", "0"], "--tasks: must be ≥ 1, got 0"),
                       (["--sessions", "-3"], "--sessions: must be ≥ 1"),
                       (["--calls", "two"], "--calls: 'two' is not an integer"),
                       (["--concurrency", "0"], "--concurrency: must be ≥ 1"),
                       (["--temperature", "-1"], "--temperature: must be ≥ 0"),
                       (["overheads"], "unknown section 'overheads': choose from episodes, overhead, vllm")):
        proc = run(tmp_path, *args)
        assert proc.returncode == 2, args
        assert said in proc.stderr, (args, proc.stderr)
    assert not (tmp_path / "runs").exists()  # no report written


def test_quick_sizes_defaults_and_overrides(tmp_path):
    full = json.loads(run(tmp_path, "--dry-run").stdout)
    assert full["sections"] == ["episodes", "overhead", "vllm"]
    assert (full["tasks"], full["concurrency"], full["sessions"], full["calls"]) == (8, 8, 64, 16)
    quick = json.loads(run(tmp_path, "--quick", "--dry-run").stdout)
    assert (quick["tasks"], quick["concurrency"], quick["sessions"], quick["calls"]) == (2, 2, 8, 4)
    mixed = json.loads(run(tmp_path, "overhead", "overhead", "--quick", "--sessions", "64", "--dry-run").stdout)
    assert mixed["sections"] == ["overhead"] and mixed["sessions"] == 64 and mixed["calls"] == 4
    assert not (tmp_path / "runs").exists()
