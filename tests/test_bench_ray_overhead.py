"""bench/ray_overhead.py's arguments and arms. Its `--quick` run starts Ray and five engines (70 s on 2 loaded
cores), too slow for the suite: only what it decides before anything loads is tested here."""

import importlib.util
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "bench" / "ray_overhead.py"
spec = importlib.util.spec_from_file_location("ray_overhead", PATH)
bench = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = bench  # dataclasses look their module up there
spec.loader.exec_module(bench)


def test_defaults_and_quick_sizes():
    args = bench.parse_args([])
    assert (args.tasks, args.concurrency, args.repeats, args.max_tokens, args.quick) == (16, 16, 2, 48, False)
    quick = bench.parse_args(["--quick"])
    assert (quick.tasks, quick.concurrency, quick.repeats) == (4, 4, 2)
    mixed = bench.parse_args(["--quick", "--tasks", "6", "--concurrency", "2", "--repeats", "3"])
    assert (mixed.tasks, mixed.concurrency, mixed.repeats) == (6, 2, 3)


@pytest.mark.parametrize("bad", [["--repeats", "0"], ["--tasks", "0"], ["--concurrency", "x"], ["--max-tokens", "-1"]])
def test_bad_values_are_refused(bad, capsys):
    with pytest.raises(SystemExit) as e:
        bench.parse_args(bad)
    assert e.value.code == 2 and "argument" in capsys.readouterr().err


def test_arms_split_the_cores():
    assert [(a.workers, a.cpus) for a in bench.arms(1)] == [(0, 1), (1, 1)]  # no room for two workers
    assert [(a.workers, a.cpus) for a in bench.arms(2)] == [(0, 2), (1, 2), (2, 1)]
    assert [(a.workers, a.cpus) for a in bench.arms(5)] == [(0, 5), (1, 5), (2, 2)]
