"""The estimator ablation: every advantage estimator with the same seeds, tasks and rollout budget —
DocRead on HotpotQA train → held-out evaluation on the test split — in one command.

Run: `.venv/bin/python bench/ablate.py [--steps N] [--eval-limit N] [--only grpo,gigpo]` (CPU defaults: 2
steps of 2 tasks × 4 episodes from `configs/docread_cigpo.yaml`, 24 test questions; ~7 min per variant on
2 cores). Scale to GPU by pointing `--config` at a bigger recipe. `--smoke` runs every variant for one step
on a randomly initialised tiny model of the same architecture to check the plumbing in minutes: its numbers
mean nothing. Writes `runs/ablate/ablation.md`, `runs/ablate/curves.png` and one folder per variant (each
resumable: re-running continues where a variant stopped).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common import publish

ROOT = Path(__file__).resolve().parents[1]
VARIANTS: dict[str, list[str]] = {
    "grpo": ["algorithm.estimator=grpo"],
    "dr_grpo": ["algorithm.estimator=dr_grpo", "loss.aggregation=seq_mean_token_sum_norm"],
    "gigpo": ["algorithm.estimator=gigpo"],
    **{f"info_gain/{v}": ["algorithm.estimator=info_gain", f"algorithm.estimator_args={{variant: {v}}}"]
       for v in ("gold_prob", "gold_logprob", "entropy", "kl")},
    "info_gain/support": ["algorithm.estimator=info_gain",
                          "algorithm.estimator_args={variant: support, step_baseline: turn_index}"],
    "cw_grpo": ["algorithm.estimator=cw_grpo"],
    "cw_grpo_adv": ["algorithm.estimator=cw_grpo_adv", "algorithm.estimator_args={step_reward: {variant: gold_prob}}"],
    "gear_mix": ["algorithm.estimator=gear_mix",
                 "algorithm.estimator_args={granularities: [outcome, tool, info_gain]}"],
    "gear_gt": ["algorithm.estimator=gear_gt"],
}
READER_ARG = {"info_gain": "reader", "cw_grpo_adv": "step_reward", "gear_mix": "step_reward", "gear_gt": "reader"}


def sleuth(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "sleuth.cli", *args], check=True)


def metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--config", default=str(ROOT / "configs" / "docread_cigpo.yaml"))
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--eval-limit", type=int, default=24)
    ap.add_argument("--only", help="comma list of variants")
    ap.add_argument("--out", default="runs/ablate")
    ap.add_argument("--smoke", action="store_true", help="tiny random model, one step, two eval questions")
    args = ap.parse_args()
    names = args.names = args.only.split(",") if args.only else list(VARIANTS)
    out = Path(args.out)
    common = ["--set", "checkpoint.export_hf=true", "--set", "tensorboard=false"]
    eval_extra: list[str] = []
    model = None
    if args.smoke:
        from sleuth.agents.models import tiny_model

        model = tiny_model(Path(tempfile.mkdtemp()) / "tiny")
        args.steps, args.eval_limit = 1, 2
        common += ["--set", f"model={model}", "--set", "rollout.max_tokens=8", "--set", "rollout.group_size=2"]
        eval_extra = ["--max-tokens", "8"]
    rows = []
    for name in names:
        run = out / name.replace("/", "-")
        # the base config's estimator arguments belong to its own estimator: start each variant from none
        extra = ["--set", "algorithm.estimator_args={}", *(a for s in VARIANTS[name] for a in ("--set", s))]
        est = VARIANTS[name][0].split("=", 1)[1]
        if model and est in READER_ARG:  # smoke mode: the reader is the tiny model too (set after the args)
            value = model if READER_ARG[est] == "reader" else f"{{reader: {model}}}"
            extra += ["--set", f"algorithm.estimator_args.{READER_ARG[est]}={value}"]
        sleuth("train", "--config", args.config, "--out", str(run), "--max-steps", str(args.steps), "--resume",
               *common, *extra)
        sleuth("eval", "--env", "sleuth/DocRead-v0", "--tasks", "hotpotqa:test", "--limit", str(args.eval_limit),
               "--policy", str(run / "hf"), "--harness", "text", "--out", str(run / "eval"), *eval_extra)
        summary = json.loads((run / "eval" / "summary.json").read_text())
        m = metrics(run)
        cost = sum(r.get(f"time/{k}", 0.0) for r in m for k in ("rollout", "reward", "update", "sync")) / max(len(m), 1)
        rows.append({"variant": name, "em": summary["em"], "f1": summary["f1"],
                     "support_recall": summary["support_recall"], "mean_reads": summary.get("mean_reads", 0.0),
                     "s_per_step": cost, "reward_curve": [r.get("reward/mean", 0.0) for r in m]})
        write(out, rows, args)  # after every variant: an interrupted ablation keeps its finished rows


def write(out: Path, rows: list[dict], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for r in rows:
        ax.plot(range(1, len(r["reward_curve"]) + 1), r["reward_curve"], marker="o", label=r["variant"])
    ax.set_xlabel("step")
    ax.set_ylabel("train reward (mean F1 of the step's episodes)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "curves.png", dpi=90)
    lines = [f"{'SMOKE RUN (random tiny model: numbers mean nothing). ' if args.smoke else ''}"
             f"{args.steps} training steps per variant, same seeds and tasks; held-out: {args.eval_limit} "
             "HotpotQA test questions, greedy, text harness.", "",
             "| variant | EM | F1 | support recall | mean reads | s / step |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['em']:.3f} | {r['f1']:.3f} | {r['support_recall']:.3f} | "
                     f"{r['mean_reads']:.2f} | {r['s_per_step']:.1f} |")
    lines += ["", "![learning curves](curves.png)"]
    report = "\n".join(lines)
    (out / "ablation.md").write_text(f"# Estimator ablation\n\n{report}\n")
    if len(rows) == len(args.names):
        publish("ablate", "Estimator ablation", report)


if __name__ == "__main__":
    main()
