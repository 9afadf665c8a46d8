"""The estimator ablation: every advantage estimator from the same warm-start checkpoint, with the same
seeds, training tasks and rollout budget (episodes, not steps), then the same held-out questions.

Run: `.venv/bin/python bench/ablate.py [--budget EPISODES] [--eval-limit N] [--only grpo,gigpo]`. CPU
defaults: 32 episodes per estimator (4 steps of 2 tasks × 4 from `configs/docread_cigpo.yaml`), from the
warm start `runs/main/sft/hf` (`make run` builds it; built here when missing), 48 HotpotQA test questions
(as `make run`), greedy, text harness; 76 min for all thirteen on a 2-core Xeon in bf16. On a GPU raise
`--budget` (and the recipe's group size with `--set rollout.group_size=16`, applied to every variant).
`--smoke` runs every variant for one step on a randomly initialised tiny model of the same architecture to
check the plumbing in minutes: its numbers mean nothing.

Writes `runs/ablate/ablation.md` (per estimator: EM, F1, support recall of reads, tool-call error rate and
answered rate, each with a 95% bootstrap CI over questions, and the paired difference against grpo with
its CI; seconds per step split into rollout / reward / update), `runs/ablate/curves.png` (train reward and
support recall of the training reads per step) and one folder per estimator (its HF export, rollouts,
metrics and eval; a variant's DeepSpeed checkpoint is deleted once it is evaluated, and a rerun skips
finished variants).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from common import publish

ROOT = Path(__file__).resolve().parents[1]
VARIANTS: dict[str, list[str]] = {
    "grpo": ["algorithm.estimator=grpo"],
    "dr_grpo": ["algorithm.estimator=dr_grpo", "loss.aggregation=seq_mean_token_sum_norm"],
    "rloo": ["algorithm.estimator=rloo"],
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
# The per-question values: the verifier's numbers, then the episode's share of invalid tool calls and whether
# it ended by answering.
METRICS = [("em", "EM"), ("f1", "F1"), ("support_recall", "support recall"),
           ("tool_error_share", "tool-call error rate"), ("answered", "answered")]
BASELINE = "grpo"
WARM = "warm start (no RL)"


def sleuth(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "sleuth.cli", *args], check=True)


def metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def per_question(eval_dir: Path) -> dict[str, dict[str, float]]:
    from sleuth.agents.compare import per_task
    from sleuth.agents.evaluate import load_trajectories

    return per_task(load_trajectories(eval_dir / "trajectories.jsonl"))


def mean_ci(values: list[float]) -> tuple[float, float, float]:
    from sleuth.agents.compare import bootstrap_ci

    return sum(values) / len(values), *bootstrap_ci(values)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "configs" / "docread_cigpo.yaml"))
    ap.add_argument("--warm-start", default="runs/main/sft/hf", help="the checkpoint every estimator starts from")
    ap.add_argument("--budget", type=int, default=32, help="training episodes per estimator")
    # 48, as `make run`: at 24 questions the paired CI of an F1 difference spanned about ±0.14
    ap.add_argument("--eval-limit", type=int, default=48, help="held-out HotpotQA test questions")
    ap.add_argument("--only", help="comma list of variants")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key of the recipe for every variant, e.g. --set rollout.group_size=8 "
                         "(repeatable; the budget is counted with the overridden group size and tasks per step)")
    ap.add_argument("--out", default="runs/ablate")
    ap.add_argument("--smoke", action="store_true", help="tiny random model, one step, two eval questions")
    ap.add_argument("--report", action="store_true", help="only rewrite the report from the finished variants")
    args = ap.parse_args()
    names = args.names = args.only.split(",") if args.only else list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    out = Path(args.out)
    from sleuth.cli_args import parse_kv
    from sleuth.training.config import ConfigError, load_config

    try:
        base = load_config(args.config, parse_kv(args.set, flag="--set"))
    except ConfigError as e:  # before any variant runs: a typo would otherwise fail eleven trainings
        ap.error(str(e))
    per_step = base.rollout.tasks_per_step * base.rollout.group_size
    args.steps = max(1, args.budget // per_step)
    common = [*(a for s in args.set for a in ("--set", s)),
              "--set", "checkpoint.export_hf=true", "--set", "tensorboard=false", "--set", "checkpoint.every=0"]
    eval_extra: list[str] = []
    model = args.warm_start
    if args.smoke:
        from sleuth.agents.models import tiny_model

        model = str(tiny_model(Path(tempfile.mkdtemp()) / "tiny"))
        args.steps, args.eval_limit = 1, 2
        common += ["--set", "rollout.max_tokens=8", "--set", "rollout.group_size=2"]
        eval_extra = ["--max-tokens", "8"]
    elif not args.report and not (Path(model) / "config.json").exists():
        if model != "runs/main/sft/hf":
            ap.error(f"--warm-start {model} is not a model directory")
        sleuth("sft", "--config", str(ROOT / "configs" / "docread_sft.yaml"), "--out", "runs/main/sft", "--resume")
    args.episodes = args.steps * base.rollout.tasks_per_step * (2 if args.smoke else base.rollout.group_size)
    args.start = model
    if args.report:
        rows = [row(name, out / name.replace("/", "-")) for name in names
                if (out / name.replace("/", "-") / "eval" / "summary.json").exists()]
        write(out, rows, args)
        return
    evaluate = ["--env", "sleuth/DocRead-v0", "--tasks", "hotpotqa:test", "--limit", str(args.eval_limit),
                "--harness", "text", *eval_extra]
    sleuth("eval", *evaluate, "--policy", model, "--out", str(out / "warm-start"))
    rows = []
    for name in names:
        run = out / name.replace("/", "-")
        # the base config's estimator arguments belong to its own estimator: start each variant from none
        extra = ["--set", "algorithm.estimator_args={}", *(a for s in VARIANTS[name] for a in ("--set", s))]
        est = VARIANTS[name][0].split("=", 1)[1]
        if args.smoke and est in READER_ARG:  # smoke mode: the reader is the tiny model too (set after the args)
            value = model if READER_ARG[est] == "reader" else f"{{reader: {model}}}"
            extra += ["--set", f"algorithm.estimator_args.{READER_ARG[est]}={value}"]
        if not (run / "eval" / "summary.json").exists():  # a finished variant is kept as it is
            sleuth("train", "--config", args.config, "--out", str(run), "--max-steps", str(args.steps),
                   "--resume", "--set", f"model={model}", *common, *extra)
            sleuth("eval", *evaluate, "--policy", str(run / "hf"), "--out", str(run / "eval"))
        # DeepSpeed's checkpoint (2 GB of fp32 optimizer state) is only for resuming training, and the
        # variant is finished: eleven of them would otherwise hold 23 GB. Its HF export stays.
        shutil.rmtree(run / "checkpoints", ignore_errors=True)
        rows.append(row(name, run))
        write(out, rows, args)  # after every variant: an interrupted ablation keeps its finished rows


def row(name: str, run: Path) -> dict:
    m = metrics(run)
    cost = {k: sum(r.get(f"time/{k}", 0.0) for r in m) / max(len(m), 1) for k in ("rollout", "reward", "update")}
    return {"variant": name, "questions": per_question(run / "eval"), "cost": cost,
            "reward_curve": [r.get("reward/mean", 0.0) for r in m],
            "support_curve": [r.get("reward/support_recall/mean", 0.0) for r in m]}


def diff_cell(q: dict, ref: dict, key: str, ids: list[str], label: str) -> str:
    """The paired difference against a reference run on the questions both have, with its bootstrap CI."""
    from sleuth.agents.compare import bootstrap_ci

    diffs = [q[t][key] - ref[t][key] for t in ids if key in ref.get(t, {})]
    if not diffs:
        return ""
    low, high = bootstrap_ci(diffs)
    mark = "*" if low > 0 or high < 0 else ""
    return f"<br>{label} {sum(diffs) / len(diffs):+.3f}{mark} [{low:+.2f}, {high:+.2f}]"


def table(rows: list[dict], warm: dict[str, dict[str, float]]) -> list[str]:
    head = "| estimator | " + " | ".join(label for _, label in METRICS) + " | s / step (rollout + reward + update) |"
    lines = [head, "|" + "---|" * (len(METRICS) + 2)]
    base = next((r["questions"] for r in rows if r["variant"] == BASELINE), None)
    for r in [{"variant": WARM, "questions": warm, "cost": None}, *rows]:
        q = r["questions"]
        cells = []
        for key, _ in METRICS:
            ids = sorted(t for t in q if key in q[t])
            if not ids:
                cells.append("–")
                continue
            mean, low, high = mean_ci([q[t][key] for t in ids])
            cell = f"{mean:.3f} [{low:.2f}, {high:.2f}]"
            if r["variant"] != WARM:
                cell += diff_cell(q, warm, key, ids, "vs warm")
            if base is not None and r["variant"] not in (BASELINE, WARM):
                cell += diff_cell(q, base, key, ids, f"vs {BASELINE}")
            cells.append(cell)
        c = r["cost"]
        cost = f"{sum(c.values()):.0f} ({c['rollout']:.0f} + {c['reward']:.1f} + {c['update']:.0f})" if c else "–"
        lines.append(f"| {r['variant']} | " + " | ".join(cells) + f" | {cost} |")
    return lines


def write(out: Path, rows: list[dict], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in rows:
        steps = range(1, len(r["reward_curve"]) + 1)
        axes[0].plot(steps, r["reward_curve"], marker="o", label=r["variant"])
        axes[1].plot(steps, r["support_curve"], marker="o", label=r["variant"])
    axes[0].set_ylabel("train reward (mean F1 of the step's episodes)")
    axes[1].set_ylabel("support recall of the step's reads")
    for ax in axes:
        ax.set_xlabel("step")
        ax.xaxis.get_major_locator().set_params(integer=True)
    axes[1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "curves.png", dpi=90)
    warm = per_question(out / "warm-start")
    lines = [f"{'SMOKE RUN (random tiny model: numbers mean nothing). ' if args.smoke else ''}"
             f"Every estimator from the same warm start (`{args.start}`), {args.episodes} training episodes "
             f"each ({args.steps} step{'s' * (args.steps > 1)}), same seeds and tasks; held-out: the same {args.eval_limit} HotpotQA test "
             "questions for every row, greedy, text harness. Each cell: the mean over questions with its 95% "
             f"bootstrap CI, then the paired differences against the warm start and against {BASELINE}, each "
             "with its 95% paired-bootstrap CI (`*`: the CI excludes 0)."
             + (f" Recipe overrides for every variant: {', '.join(f'`{o}`' for o in args.set)}." if args.set else ""),
             "", *table(rows, warm), "", "![learning curves](curves.png)"]
    report = "\n".join(lines)
    (out / "ablation.md").write_text(f"# Estimator ablation\n\n{report}\n")
    if len(rows) == len(args.names):
        publish("ablate", "Estimator ablation", report)


if __name__ == "__main__":
    main()
