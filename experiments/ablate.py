"""The estimator ablation: advantage estimators from the same warm-start checkpoint, with the same seeds,
training tasks (hotpotqa:train) and rollout budget (episodes, not steps), then the same held-out questions.

Run: `.venv/bin/python experiments/ablate.py [--env docread|search] [--budget EPISODES] [--arms issue|search|all]
[--only grpo,gigpo] [--dev-limit N] [--eval-limit N] [--reader PATH]`.

Arms, grpo first (the matched outcome-only baseline every other arm is compared to):
- `--arms issue`, the default on DocRead: grpo, info_gain/support, info_gain/gold_prob@reader (gold_prob whose
  reader is `--reader`, by default the lexical-SFT model `runs/main/lexical-sft/hf` where it exists, else the
  warm start), cw_grpo, cw_grpo_adv, gear_mix;
- `--arms all`: every variant of VARIANTS;
- `--env search` runs the same harness on `sleuth/Search-v0` (BM25 over every HotpotQA paragraph, `search`,
  `open`, `answer`) with its own warm start, SFT on scripted-oracle Search demonstrations of 100 train
  questions (`configs/docread_sft.yaml` with `data.env=Search-v0`; built into `runs/ablate-search/warm` when
  missing), and the arms grpo, cw_grpo, info_gain/support (`--arms search`).
An env whose turns carry no read events (`Turn.read`; one scripted-oracle episode is checked) gets no arm
whose step reward comes from them (info_gain, cw_grpo_adv, gear_mix: it would be 0 on every turn), and
cw_grpo there judges with its LLM judge (SmolLM2-135M-Instruct), since its rule judge counts only read
events; the report says so. DocRead's `read` and Search's `open` both report read events: every arm runs on both.

Held out: every trained model and the warm start on the first `--dev-limit` (100) questions of hotpotqa:dev
and the first `--eval-limit` (48, as `make run`) of hotpotqa:test, greedy, text harness; the trainer refuses
training tasks from either. Dev chose the recipes' settings; test was never used for a choice.

Budget and cost: the CPU default is 32 episodes per arm (4 steps of 2 tasks × 4 from
`configs/docread_cigpo.yaml`, its KL anchor included): with 48 test questions that took 3–8 min per arm on 2
cores; the 100 dev questions add ~2 min per model on DocRead, ~4 on Search. The issue's budget is 480
episodes (60 steps) per arm, measured on a 2-core Xeon with AMX-BF16:
- `.venv/bin/python experiments/ablate.py --budget 480`: DocRead, 6 arms, 2 h 0 min (13–22 s per step, 17–25 min
  per arm with its evaluations; building the lexical-SFT reader first adds ~35 min);
- `.venv/bin/python experiments/ablate.py --env search --budget 480`: Search, 3 arms, ~2 h (about 30 s per step,
  ~38 min per arm with its evaluations; the warm start's SFT and evaluations ~15 min).
Run nothing else on the machine meanwhile: a second 2-thread torch process on 2 cores made both ~5× slower.
On a GPU raise the group size too (`--set rollout.group_size=16`, applied to every arm). `--smoke` runs the
chosen arms for one step on a randomly initialised tiny model of the same architecture (`<out>/tiny`; on
Search, its warm start is one SFT step of that model) to check the plumbing: its numbers mean nothing, and it
publishes nothing. The default arms took 3.8 min (DocRead, 6 arms) and 2.0 min (Search) on 2 busy cores.

Writes `<out>/ablation.md` (`runs/ablate`, `runs/ablate-search`): one table per held-out set, per arm EM, F1,
support recall of reads, tool-call error rate and answered rate, each with a 95% bootstrap CI over questions
and the paired differences against the warm start and against grpo with their CIs, and seconds per step
split into rollout / reward / update; `<out>/curves.png` (train reward and support recall of the training
reads per step); one folder per arm (its HF export, rollouts, metrics, `eval-dev`, `eval-test`). An arm's
DeepSpeed checkpoint is deleted once it is evaluated; a rerun skips what is finished (training when the HF
export exists, each evaluation when its summary does).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ablate_report import HeldOut, eval_dir, evaluated, per_question, row, write

ROOT = Path(__file__).resolve().parents[1]
OUT = Path("runs/experiments")
VARIANTS: dict[str, list[str]] = {
    "grpo": ["algorithm.estimator=grpo"],
    "dr_grpo": ["algorithm.estimator=dr_grpo", "loss.aggregation=seq_mean_token_sum_norm"],
    "rloo": ["algorithm.estimator=rloo"],
    "gigpo": ["algorithm.estimator=gigpo"],
    **{f"info_gain/{v}": ["algorithm.estimator=info_gain", f"algorithm.estimator_args={{variant: {v}}}"]
       for v in ("gold_prob", "gold_logprob", "entropy", "kl")},
    **{f"info_gain/{v}": ["algorithm.estimator=info_gain",
                          f"algorithm.estimator_args={{variant: {v}, step_baseline: turn_index}}"]
       for v in ("support", "answer")},
    "cw_grpo": ["algorithm.estimator=cw_grpo"],
    "cw_grpo_adv": ["algorithm.estimator=cw_grpo_adv", "algorithm.estimator_args={step_reward: {variant: gold_prob}}"],
    "gear_mix": ["algorithm.estimator=gear_mix",
                 "algorithm.estimator_args={granularities: [outcome, tool, info_gain]}"],
    "gear_gt": ["algorithm.estimator=gear_gt"],
}
# Arms that are a variant with `--reader` as its reader: a model stronger than the untrained SmolLM2 the
# variant reads with by default.
READER_ARMS = {"info_gain/gold_prob@reader": "info_gain/gold_prob"}
READER_ARG = {"info_gain": "reader", "cw_grpo_adv": "step_reward", "gear_mix": "step_reward", "gear_gt": "reader"}
# Estimators whose step reward is computed from the turns' read events (`Turn.read`).
NEEDS_READS = ("info_gain", "cw_grpo_adv", "gear_mix")
ARMS = {"issue": ["grpo", "info_gain/support", "info_gain/gold_prob@reader", "cw_grpo", "cw_grpo_adv", "gear_mix"],
        "search": ["grpo", "cw_grpo", "info_gain/support"],
        "all": list(VARIANTS)}
DOCREAD_WARM = "runs/main/sft/hf"
LEXICAL_READER = "runs/main/lexical-sft/hf"


@dataclass(frozen=True)
class Setup:
    """An env the ablation runs on: its id, its default arm set and output folder, the report's title and
    what its support recall counts."""
    env: str
    arms: str
    out: str
    title: str
    reads: str


SETUPS = {"docread": Setup("sleuth/DocRead-v0", "issue", "runs/ablate", "Estimator ablation", "reads"),
          "search": Setup("sleuth/Search-v0", "search", "runs/ablate-search", "Estimator ablation on Search",
                          "opened documents")}


def sleuth(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "sleuth.cli", *args], check=True)


def has_model(path: str | Path) -> bool:
    return (Path(path) / "config.json").exists()


def held_out_sets(dev_limit: int, eval_limit: int) -> list[HeldOut]:
    return [HeldOut("dev", "hotpotqa:dev", dev_limit), HeldOut("test", "hotpotqa:test", eval_limit)]


def estimator(name: str) -> str:
    return VARIANTS[READER_ARMS.get(name, name)][0].split("=", 1)[1]


def reports_reads(env: str) -> bool:
    """Whether the env's turns carry read events (`Turn.read`), from one scripted-oracle episode of a train
    question: the oracle reads or opens every supporting document."""
    import sleuth as sl
    from sleuth.agents.loop.episodes import run_episodes
    from sleuth.agents.policies.load import load_policy
    from sleuth.tasks import load_tasks

    trajs = list(run_episodes(lambda: sl.make(env, harness="text"), load_tasks("hotpotqa:train", limit=1),
                              load_policy("oracle")))
    return any(turn.read is not None for t in trajs for turn in t.turns)


def fit_to_env(names: list[str], reads: bool) -> tuple[list[str], list[str]]:
    """The arms that can run on an env with (or without) read events, and the report's notes on what changed."""
    if reads:
        return names, []
    dropped = [n for n in names if estimator(n) in NEEDS_READS]
    notes = []
    if dropped:
        notes.append(f"Left out: {', '.join(dropped)}. Their step reward comes from the turns' read events "
                     "(`Turn.read`), which this env's turns do not carry, so it would be 0 on every turn and the "
                     "arm grpo's outcome advantage.")
    if any(estimator(n) == "cw_grpo" for n in names):
        notes.append("cw_grpo judges each round with its LLM judge (SmolLM2-135M-Instruct, `judge: llm`): its rule "
                     "judge counts a round useful only by a read event, so here it would weight every non-final "
                     "round 0 and train a success's answer turn alone.")
    return [n for n in names if n not in dropped], notes


def arm_overrides(name: str, args: argparse.Namespace) -> list[str]:
    """The `--set` arguments that make arm `name`. The base config's estimator arguments belong to its own
    estimator, so every arm starts from none."""
    sets = ["algorithm.estimator_args={}", *VARIANTS[READER_ARMS.get(name, name)]]
    est = estimator(name)
    if name in READER_ARMS:
        sets.append(f"algorithm.estimator_args.reader={args.reader}")
    elif args.smoke and est in READER_ARG:  # smoke mode: the reader is the tiny model too (set after the args)
        value = args.start if READER_ARG[est] == "reader" else f"{{reader: {args.start}}}"
        sets.append(f"algorithm.estimator_args.{READER_ARG[est]}={value}")
    if est == "cw_grpo" and not args.reads:
        sets.append("algorithm.estimator_args.judge=llm")
        if args.smoke:
            sets.append(f"algorithm.estimator_args.judge_policy={args.start}")
    return [a for s in sets for a in ("--set", s)]


def build_search_warm_start(run: Path, smoke_model: str | None) -> None:
    """The Search warm start: `configs/docread_sft.yaml`'s recipe on Search demonstrations of the scripted
    oracle (it searches each supporting title, opens it, answers the gold answer); dev stays out of its data.
    `smoke_model`: one SFT step of that model on two demonstrations."""
    smoke = ["--set", f"model={smoke_model}", "--set", "data.task_limit=2", "--max-steps", "1"] if smoke_model else []
    sleuth("sft", "--config", str(ROOT / "configs" / "docread_sft.yaml"), "--out", str(run), "--resume",
           "--set", "data.env=Search-v0", "--set", "data.demonstrator=oracle", "--set", "data.held_out=[hotpotqa:dev]",
           *smoke)


def warm_start(args: argparse.Namespace, out: Path, ap: argparse.ArgumentParser) -> str:
    """The checkpoint every arm starts from, built when it is the env's default and missing. Smoke mode: a
    tiny random model (also every reader), on Search after one SFT step."""
    search_warm = out / "warm"
    if args.smoke:
        from sleuth.agents.policies.models import tiny_model

        tiny = args.reader = tiny_model(out / "tiny")
        if args.env != "search":
            return tiny
        if not has_model(search_warm / "hf"):
            build_search_warm_start(search_warm, tiny)
        return str(search_warm / "hf")
    start = args.warm_start or (str(search_warm / "hf") if args.env == "search" else DOCREAD_WARM)
    if args.report or has_model(start):
        return start
    if args.warm_start:
        ap.error(f"--warm-start {start} is not a model directory")
    if args.env == "search":
        build_search_warm_start(search_warm, None)
    else:
        sleuth("sft", "--config", str(ROOT / "configs" / "docread_sft.yaml"), "--out", "runs/main/sft", "--resume")
    return start


def reader_note(args: argparse.Namespace, out: Path) -> str:
    """Which model `info_gain/gold_prob@reader` reads with: the one its finished run recorded, else `--reader`."""
    import yaml

    name = next(n for n in args.names if n in READER_ARMS)
    config = out / name.replace("/", "-") / "config.yaml"
    reader = yaml.safe_load(config.read_text())["algorithm"]["estimator_args"]["reader"] if config.exists() \
        else args.reader
    if args.smoke:
        what = "the smoke run's tiny model"
    elif reader == LEXICAL_READER:
        what = "the lexical-SFT model (`configs/docread_lexical_sft.yaml`)"
    elif reader == args.start:
        what = (f"the warm start ({LEXICAL_READER}, the lexical-SFT model, was missing: `sleuth sft --config "
                f"configs/docread_lexical_sft.yaml --out {Path(LEXICAL_READER).parent}` builds it)")
    else:
        what = "given by `--reader`"
    return f" `{name}` reads with `{reader}`, {what}."


def header(args: argparse.Namespace, out: Path) -> str:
    steps = f"{args.steps} step{'s' * (args.steps > 1)}"
    sets = " and ".join(h.describe() for h in args.sets)
    text = (f"{'SMOKE RUN (random tiny model: numbers mean nothing). ' if args.smoke else ''}"
            f"Every arm on `{args.setup.env}` from the same warm start (`{args.start}`), {args.episodes} training "
            f"episodes each ({steps}), same seeds and hotpotqa:train tasks; grpo is the matched outcome-only arm "
            f"every other arm is compared to. Held out: {sets}, the same for every row, greedy, text harness "
            "(dev chose the recipes' settings; test never did). Each cell: the mean over questions with its 95% "
            "bootstrap CI, then the paired differences against the warm start and against grpo, each with its 95% "
            "paired-bootstrap CI (`*`: the CI excludes 0). s / step: a training step's mean wall seconds.")
    if any(n in READER_ARMS for n in args.names):
        text += reader_note(args, out)
    if args.set:
        text += f" Recipe overrides for every arm: {', '.join(f'`{o}`' for o in args.set)}."
    return " ".join([text, *args.notes])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", choices=list(SETUPS), default="docread")
    ap.add_argument("--config", default=str(ROOT / "configs" / "docread_cigpo.yaml"))
    ap.add_argument("--warm-start", help=f"the checkpoint every arm starts from (default: {DOCREAD_WARM} on DocRead, "
                                         "<out>/warm/hf on Search; either is built when missing)")
    ap.add_argument("--budget", type=int, default=32, help="training episodes per arm")
    ap.add_argument("--dev-limit", type=int, default=100, help="held-out HotpotQA dev questions (the first N)")
    # 48, as `make run`: at 24 questions the paired CI of an F1 difference spanned about ±0.14
    ap.add_argument("--eval-limit", type=int, default=48, help="held-out HotpotQA test questions (the first N)")
    ap.add_argument("--arms", choices=list(ARMS), help="the arm set (default: issue on DocRead, search on Search)")
    ap.add_argument("--only", help=f"comma list of arms instead of a set: {', '.join([*VARIANTS, *READER_ARMS])}")
    ap.add_argument("--reader", help=f"the reader of info_gain/gold_prob@reader (default: {LEXICAL_READER} where it "
                                     "exists, else the warm start)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key of the recipe for every arm, e.g. --set rollout.group_size=8 "
                         "(repeatable; the budget is counted with the overridden group size and tasks per step)")
    ap.add_argument("--out", help="default: runs/ablate (DocRead), runs/ablate-search (Search)")
    ap.add_argument("--smoke", action="store_true", help="tiny random model, one step, two questions per set")
    ap.add_argument("--report", action="store_true", help="only rewrite the report from the finished arms")
    args = ap.parse_args()
    args.setup = setup = SETUPS[args.env]
    names = args.only.split(",") if args.only else ARMS[args.arms or setup.arms]
    unknown = [n for n in names if n not in VARIANTS and n not in READER_ARMS]
    if unknown:
        ap.error(f"unknown arm(s) {unknown}; known: {', '.join([*VARIANTS, *READER_ARMS])}")
    out = Path(args.out or setup.out)
    from sleuth.core.args import parse_kv
    from sleuth.core.errors import ConfigError
    from sleuth.training.config import load_config

    try:
        base = load_config(args.config, parse_kv(args.set, flag="--set"))
    except ConfigError as e:  # before any arm runs: a typo would otherwise fail every training
        ap.error(str(e))
    per_step = base.rollout.tasks_per_step * base.rollout.group_size
    args.steps = max(1, args.budget // per_step)
    args.sets = held_out_sets(args.dev_limit, args.eval_limit)
    args.reads = reports_reads(setup.env)  # before any warm start is built: a set that cannot run fails at once
    args.names, args.notes = fit_to_env(names, args.reads)
    for note in args.notes:
        print(f"ablate: {note}", file=sys.stderr)
    if not args.names:
        ap.error(f"no arm of {names} can run on {setup.env}")
    # the trainer refuses training tasks from the test split by itself; eval.tasks adds dev to that check
    common = [*(a for s in args.set for a in ("--set", s)), "--set", f"env={setup.env.split('/')[-1]}",
              "--set", "eval.tasks=hotpotqa:dev", "--set", "checkpoint.export_hf=true", "--set", "tensorboard=false",
              "--set", "checkpoint.every=0"]
    eval_extra: list[str] = []
    if args.smoke:
        args.steps, args.sets = 1, held_out_sets(2, 2)
        common += ["--set", "rollout.max_tokens=8", "--set", "rollout.group_size=2"]
        eval_extra = ["--max-tokens", "8"]
    args.start = start = warm_start(args, out, ap)
    args.episodes = args.steps * base.rollout.tasks_per_step * (2 if args.smoke else base.rollout.group_size)
    args.reader = args.reader or (LEXICAL_READER if has_model(LEXICAL_READER) else start)
    runs = {name: out / name.replace("/", "-") for name in args.names}
    warm_run = out / "warm-start"
    if args.report:
        if not evaluated(warm_run, args.sets):
            ap.error(f"{warm_run} has no finished evaluation on every held-out set: nothing to report")
        rows = [row(name, run, args.sets) for name, run in runs.items() if evaluated(run, args.sets)]
        report(out, rows, args)
        return

    def evaluate(policy: str, run: Path) -> None:
        for held in args.sets:
            if not (eval_dir(run, held) / "summary.json").exists():
                sleuth("eval", "--env", setup.env, "--tasks", held.spec, "--limit", str(held.limit), "--harness",
                       "text", *eval_extra, "--policy", policy, "--out", str(eval_dir(run, held)))

    evaluate(start, warm_run)
    rows = []
    for name, run in runs.items():
        if not has_model(run / "hf"):  # the HF export is written once training has finished
            sleuth("train", "--config", args.config, "--out", str(run), "--max-steps", str(args.steps),
                   "--resume", "--set", f"model={start}", *common, *arm_overrides(name, args))
        evaluate(str(run / "hf"), run)
        # DeepSpeed's checkpoint (2 GB of fp32 optimizer state) is only for resuming training, and the
        # arm is finished: thirteen of them would otherwise hold 26 GB. Its HF export stays.
        shutil.rmtree(run / "checkpoints", ignore_errors=True)
        rows.append(row(name, run, args.sets))
        report(out, rows, args)  # after every arm: an interrupted ablation keeps its finished rows


def report(out: Path, rows: list[dict], args: argparse.Namespace) -> None:
    """Write the report; publish it (runs/bench/) once every arm has a row, unless it is a smoke run."""
    warm = {h.name: per_question(eval_dir(out / "warm-start", h)) for h in args.sets}
    body = write(out, args.setup.title, header(args, out), rows, warm, args.sets, args.setup.reads)
    if len(rows) == len(args.names) and not args.smoke:
        name = "ablate" if args.env == "docread" else f"ablate-{args.env}"
        print(body)
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"{name}.md").write_text(f"# {args.setup.title}\n\n{body}\n")


if __name__ == "__main__":
    main()
