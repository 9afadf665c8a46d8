"""The BFCL env's own correctness check: the `oracle` policy (BFCL's possible answer replayed through the env) on
every item of every offline BFCL v4 category, scored by bfcl-eval's checker. It must score 1.0 wherever BFCL's
ground truth passes BFCL's checker; every item where it does not is listed with the checker's reason.

    .venv/bin/python experiments/bfcl_oracle.py [--tasks bfcl:all] [--out runs/bfcl_oracle]

Runs through `sleuth eval --env bfcl:all --policy oracle` (the env in `.venv-bfcl`, as any user runs it)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

from sleuth.agents.eval.episodes import load_trajectories
from sleuth.tasks.bfcl import category_of


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default="bfcl:all")
    ap.add_argument("--out", default="runs/bfcl_oracle")
    args = ap.parse_args()
    sleuth = Path(sys.executable).with_name("sleuth")
    subprocess.run([str(sleuth), "eval", "--env", "bfcl:all", "--tasks", args.tasks, "--policy", "oracle",
                    "--concurrency", "16", "--out", args.out], check=False, stdout=subprocess.DEVNULL)
    trajs = load_trajectories(Path(args.out) / "trajectories.jsonl")
    n, passed, failed = Counter(), Counter(), Counter()
    misses = []
    for t in trajs:
        c = category_of(t.task_id)
        n[c] += 1
        if t.failed:
            failed[c] += 1
            misses.append({"id": t.task_id, "failed": t.error})
        elif t.verdict.score >= 1.0:
            passed[c] += 1
        else:
            misses.append({"id": t.task_id, "error_type": t.verdict.details.get("error_type"),
                           "error": t.verdict.details.get("error", "")[:300]})
    print("| category | items | oracle 1.0 | failed episodes |\n|---|---|---|---|")
    for c in n:
        print(f"| {c} | {n[c]} | {passed[c]} | {failed[c]} |")
    print(f"| all | {sum(n.values())} | {sum(passed.values())} | {sum(failed.values())} |")
    (Path(args.out) / "oracle_misses.jsonl").write_text("".join(json.dumps(m) + "\n" for m in misses))
    print(f"\n{len(misses)} items below 1.0: {Path(args.out) / 'oracle_misses.jsonl'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
