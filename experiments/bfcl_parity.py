"""Parity with the official harness: bfcl-eval's own `bfcl generate` + `bfcl evaluate` (in `.venv-bfcl`), pointed at
sleuth's OpenAI-compatible gateway serving a policy greedily, against `sleuth eval --env bfcl:all` with the same
policy on the same items. Prints, per category, how many items the two score the same, both accuracies, the
overall accuracy each computes BFCL's way, and each side's episodes per minute; writes the disagreements.

    .venv/bin/python experiments/bfcl_parity.py [--per-category 8] [--multi-turn-per-category 3] [--policy smollm2]
        [--out runs/bfcl_parity]

Items: the first N held-out (`test` split) items of each offline category. Both sides run one item at a time (the
official harness with `--num-threads 1`: its calls share the gateway's one unnamed session, so concurrent items
would interleave there), with the same token limit per reply; the official harness asks for temperature 0."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sleuth.agents.eval.bfcl_table import bfcl_report, item_score
from sleuth.agents.eval.episodes import load_trajectories
from sleuth.core.net import free_port, wait_healthy
from sleuth.envs.families.bfcl import BFCL
from sleuth.tasks import load_tasks, read_tasks, write_tasks
from sleuth.tasks.bfcl import CATEGORIES, category_of

MODEL = "sleuth-policy-FC"


def official_scores(root: Path, categories: list[str]) -> dict[str, dict[str, float]]:
    """item → 1.0 / 0.0 for every item `bfcl generate` answered, from bfcl-eval's score files (their first line is
    the summary, then one line per item it failed)."""
    out: dict[str, dict[str, float]] = {}
    for c in categories:
        scores = list((root / "score").rglob(f"BFCL_v4_{c}_score.json"))
        results = list((root / "result").rglob(f"BFCL_v4_{c}_result.json"))
        if not scores or not results:
            continue
        lines = [json.loads(x) for x in scores[0].read_text().splitlines() if x.strip()]
        failed = {x["id"] for x in lines[1:]}
        answered = [json.loads(x)["id"] for x in results[0].read_text().splitlines() if x.strip()]
        out[c] = {i: float(i not in failed) for i in answered}
    return out


def _reply(response: object) -> str:
    """One model reply as compared: its calls as sorted JSON, else its text."""
    if isinstance(response, list):
        calls = [{n: json.loads(a) if isinstance(a, str) else a for n, a in c.items()} for c in response]
        return json.dumps(calls, sort_keys=True)
    return str(response).strip()


def official_replies(root: Path) -> dict[str, list[str]]:
    """item → its replies in order (a multi-turn item's steps turn after turn), as `bfcl generate` stored them."""
    out = {}
    for f in (root / "result").rglob("*_result.json"):
        for line in f.read_text().splitlines():
            if line.strip():
                d = json.loads(line)
                r = d["result"]
                steps = [s for turn in r for s in turn] if d["id"].startswith("multi_turn") else [r]
                out[d["id"]] = [_reply(s) for s in steps]
    return out


def sleuth_replies(trajs: list, offered: dict[str, set[str]]) -> dict[str, list[str]]:
    """item → its replies in order, read as the gateway reads a reply (the JSON harness's calls of the tools the
    item offers; a reply whose calls name none of them is its text)."""
    from sleuth.envs.parsers import get_parser

    parser, out = get_parser("json"), {}
    for t in trajs:
        replies = []
        for turn in t.turns:
            calls = [c for c in parser.parse(turn.action_text, {}).calls if c.name in offered[t.task_id]]
            replies.append(_reply([{c.name: c.arguments} for c in calls]) if calls else turn.action_text.strip())
        out[t.task_id] = replies
    return out


def overall_csv(root: Path) -> str:
    files = list((root / "score").rglob("data_overall.csv"))
    if not files:
        return "n/a"
    header, row = files[0].read_text().splitlines()[:2]
    return dict(zip(header.split(","), row.split(","), strict=False)).get("Overall Acc", "n/a")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-category", type=int, default=8)
    ap.add_argument("--multi-turn-per-category", type=int, default=3,
                    help="a multi-turn item costs SmolLM2 ~10x a single-turn one on 2 cores")
    ap.add_argument("--categories", default=",".join(CATEGORIES))
    ap.add_argument("--policy", default="smollm2")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", default="runs/bfcl_parity")
    ap.add_argument("--compare-only", action="store_true", help="compare the runs already in --out again")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    categories = args.categories.split(",")
    tasks = [t for c in categories for t in load_tasks(f"bfcl:{c}:test")[
        : args.multi_turn_per_category if c.startswith("multi_turn") else args.per_category]]
    ids = {c: [t.id for t in tasks if category_of(t.id) == c] for c in categories}
    write_tasks(tasks, out / "items.jsonl")
    official = out / "official"
    official.mkdir(exist_ok=True)
    (official / "test_case_ids_to_generate.json").write_text(json.dumps(ids))
    bin_dir = Path(sys.executable).parent
    if not args.compare_only:
        run_both(args, out, categories, bin_dir)
    return compare(args, out, categories)


def run_both(args: argparse.Namespace, out: Path, categories: list[str], bin_dir: Path) -> None:
    """The official harness through the gateway, then sleuth eval; each side's wall time to `timing.json`."""
    official = out / "official"
    port = free_port()
    log = open(out / "gateway.log", "w")
    gateway = subprocess.Popen([str(bin_dir / "sleuth"), "serve", "gateway", "--policy", args.policy, "--port",
                                str(port), "--max-tokens", str(args.max_tokens), "--temperature", "0"],
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", 300, gateway)
        env = {**os.environ, "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1", "OPENAI_API_KEY": "sleuth",
               "BFCL_PROJECT_ROOT": str(official)}
        bfcl = [BFCL.python(), "-P", "-m", "sleuth.envs.families.bfcl_checker"]
        began = time.perf_counter()
        subprocess.run([*bfcl, "generate", "--model", MODEL, "--test-category", ",".join(categories), "--run-ids",
                        "--temperature", "0", "--num-threads", "1", "--allow-overwrite"], env=env,
                       cwd=tempfile.gettempdir(), check=True, stdout=open(out / "official_generate.log", "w"),
                       stderr=subprocess.STDOUT)
        official_s = time.perf_counter() - began
    finally:
        gateway.terminate()
        gateway.wait(60)
    subprocess.run([*bfcl, "evaluate", "--model", MODEL, "--test-category", ",".join(categories), "--partial-eval"],
                   env=env, cwd=tempfile.gettempdir(), check=True, stdout=open(out / "official_evaluate.log", "w"),
                   stderr=subprocess.STDOUT)

    began = time.perf_counter()
    subprocess.run([str(bin_dir / "sleuth"), "eval", "--env", "bfcl:all", "--tasks", str(out / "items.jsonl"),
                    "--policy", args.policy, "--max-tokens", str(args.max_tokens), "--temperature", "0",
                    "--concurrency", "1", "--out", str(out / "sleuth"), "--no-resume"], check=False,
                   stdout=open(out / "sleuth_eval.log", "w"), stderr=subprocess.STDOUT)
    sleuth_s = time.perf_counter() - began
    (out / "timing.json").write_text(json.dumps({"official_s": official_s, "sleuth_s": sleuth_s}))


def compare(args: argparse.Namespace, out: Path, categories: list[str]) -> int:
    official = out / "official"
    timing = json.loads((out / "timing.json").read_text()) if (out / "timing.json").exists() else None
    theirs = official_scores(official, categories)
    ours: dict[str, dict[str, float]] = {}
    failed = []
    played = load_trajectories(out / "sleuth" / "trajectories.jsonl")
    n_official, n_sleuth = sum(len(v) for v in theirs.values()), len(played)
    for t in played:
        score = item_score(t)
        if score is None:
            failed.append(t.task_id)
            continue
        ours.setdefault(category_of(t.task_id), {})[t.task_id] = score
    offered = {}
    for t in read_tasks(out / "items.jsonl"):
        entry = t.payload["entry"]
        names = [f["name"] for f in entry["function"]]
        names += [f["name"] for fs in entry.get("missed_function", {}).values() for f in fs]
        offered[t.id] = {n.replace(".", "_") for n in names}
    their_replies, our_replies = official_replies(official), sleuth_replies(played, offered)
    rows, disagreements = [], []
    compared = agree = same_replies = 0
    for c in categories:
        both = sorted(set(theirs.get(c, {})) & set(ours.get(c, {})))
        same = sum(theirs[c][i] == ours[c][i] for i in both)
        replies = sum(their_replies.get(i) == our_replies.get(i) for i in both)
        compared, agree, same_replies = compared + len(both), agree + same, same_replies + replies
        disagreements += [{"id": i, "official": theirs[c][i], "sleuth": ours[c][i],
                           "official_replies": their_replies.get(i), "sleuth_replies": our_replies.get(i)}
                          for i in both if theirs[c][i] != ours[c][i] or their_replies.get(i) != our_replies.get(i)]
        rows.append(f"| {c} | {len(both)} | {same} ({100 * same / max(1, len(both)):.0f}%) | {replies} | "
                    f"{100 * sum(theirs[c][i] for i in both) / max(1, len(both)):.1f} | "
                    f"{100 * sum(ours[c][i] for i in both) / max(1, len(both)):.1f} |")
    ours_table = bfcl_report([out / "sleuth"])
    ours_overall = next(line for line in ours_table.splitlines() if line.startswith("| Overall Acc |"))
    report = "\n".join([
        f"# BFCL parity: official harness vs sleuth eval ({args.policy}, greedy, {args.max_tokens} tokens per reply)",
        "", f"{time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
        f"`{' '.join(sys.argv)}`", "",
        "| category | items | same verdict | same replies, every step | official acc (%) | sleuth acc (%) |",
        "|---|---|---|---|---|---|", *rows,
        f"| all | {compared} | {agree} ({100 * agree / max(1, compared):.1f}%) | {same_replies} | | |", "",
        f"Overall Acc, BFCL's way: official `bfcl evaluate` {overall_csv(official)}; sleuth {ours_overall}", "",
        (f"Episodes per minute, one at a time: official harness through the gateway "
         f"{60 * n_official / timing['official_s']:.1f} ({n_official} in {timing['official_s']:.0f} s); sleuth eval "
         f"{60 * n_sleuth / timing['sleuth_s']:.1f} ({n_sleuth} in {timing['sleuth_s']:.0f} s). " if timing else
         "Not timed (the runs were compared again). ") +
        f"sleuth episodes failed (not scored): {len(failed)} {failed[:10]}"])
    (out / "parity.md").write_text(report + "\n")
    (out / "disagreements.jsonl").write_text("".join(json.dumps(d) + "\n" for d in disagreements))
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
