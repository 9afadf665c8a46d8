"""The BFCL table's summary columns equal what bfcl-eval's own `generate_leaderboard_csv` writes for the same
per-category accuracies (run in `.venv-bfcl`), and its CIs and paired differences behave as documented."""

from __future__ import annotations

import csv
import json
import random
import subprocess
import textwrap

import pytest

from sleuth.agents.eval.bfcl_table import COLUMNS, paired, table
from sleuth.envs.families.bfcl import BFCL
from sleuth.tasks.bfcl import CATEGORIES

# bfcl-eval's leaderboard columns (constants/column_headers.py) and the table's columns that compute them
SAME = {("data_overall.csv", "Overall Acc"): "Overall Acc",
        ("data_non_live.csv", "Non-Live Overall Acc"): "Non-Live AST",
        ("data_non_live.csv", "Simple AST"): "Non-Live Simple AST",
        ("data_live.csv", "Live Overall Acc"): "Live AST",
        ("data_multi_turn.csv", "Multi Turn Overall Acc"): "Multi Turn",
        ("data_multi_turn.csv", "Miss Param"): "multi_turn_miss_param",
        ("data_live.csv", "Relevance Detection"): "live_relevance"}


def _scores(seed: int) -> dict[str, dict[str, float]]:
    rng = random.Random(seed)
    out = {}
    for c in CATEGORIES:
        n = rng.randint(3, 40)
        out[c] = {f"{c}_{i}": float(rng.random() < rng.random()) for i in range(n)}
    return out


def test_summary_columns_equal_bfcl_evals_own_leaderboard(tmp_path):
    try:
        python = BFCL.python()
    except ImportError:
        pytest.skip("no BFCL venv (make bfcl)")
    scores = _scores(1)
    ours = {r["column"]: r["accuracy"] for r in table(scores, resamples=10)}
    board = {c: {"accuracy": sum(v.values()) / len(v), "total_count": len(v)} for c, v in scores.items()}
    script = textwrap.dedent(f"""
        import json, os, pathlib
        os.environ["BFCL_PROJECT_ROOT"] = {str(tmp_path)!r}
        from sleuth.envs.families.bfcl_checker import MODEL, register_model
        register_model()
        from bfcl_eval.eval_checker.eval_runner_helper import generate_leaderboard_csv
        board = json.loads({json.dumps(json.dumps(board))})
        table = {{MODEL: {{**board, "cost": {{"input_data": [], "output_data": []}}, "latency": {{"data": []}}}}}}
        generate_leaderboard_csv(table, pathlib.Path({str(tmp_path)!r}))
    """)
    done = subprocess.run([python, "-P", "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    for (name, column), mine in SAME.items():
        with open(tmp_path / name) as f:
            row = next(csv.DictReader(f))
        assert row[column] == f"{100 * ours[mine]:.2f}%", (name, column)


def test_a_column_is_missing_only_where_none_of_its_categories_ran_and_missing_ones_count_zero():
    scores = {"simple_python": {"a": 1.0, "b": 1.0}}
    rows = {r["column"]: r for r in table(scores, resamples=20)}
    assert rows["simple_python"]["accuracy"] == 1.0 and rows["simple_python"]["ci"] == [1.0, 1.0]
    assert rows["Non-Live Simple AST"]["accuracy"] == pytest.approx(1 / 3)  # java and javascript count 0
    assert rows["Live AST"]["accuracy"] is None and rows["Overall Acc"]["accuracy"] == pytest.approx(1 / 3 / 4 / 10)


def test_paired_differences_are_over_common_items_and_their_ci_covers_a_known_shift():
    rng = random.Random(0)
    a = {"simple_python": {f"i{k}": float(rng.random() < 0.3) for k in range(200)}}
    b = {"simple_python": {k: 1.0 for k in a["simple_python"]}, "multiple": {"only_b": 1.0}}
    rows = {r["column"]: r for r in paired(a, b, resamples=500)}
    d = rows["simple_python"]
    assert d["diff"] == pytest.approx(1 - sum(a["simple_python"].values()) / 200)
    assert d["ci"][0] < d["diff"] < d["ci"][1] and d["b_worse"] == 0 and d["n"] == 200
    assert rows["multiple"]["diff"] is None  # no item both runs scored
    assert [r["column"] for r in paired(a, b, resamples=5)] == [c for c, _, _ in COLUMNS]
