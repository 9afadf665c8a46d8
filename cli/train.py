"""The training subcommands of `sleuth`: `train` (RL), `sft` (supervised fine-tuning) and `plot`."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sleuth.cli.args import command, fail
from sleuth.core.args import bounded, parse_kv
from sleuth.core.errors import SleuthError, one_line

# What Ctrl-C or SIGTERM leaves behind: a checkpoint of the last step that finished (`sleuth.core.interrupts`); a plain
# rerun is refused (the directory holds a run)
ON_INTERRUPT = "interrupted: rerun with --resume to continue from the last checkpoint"


def _run_config(args: argparse.Namespace, load: Callable[..., Any]) -> Any:
    """A `sleuth train` / `sleuth sft` config: the YAML, then `--out`, `--max-steps` and `--set` on top."""
    overrides = parse_kv(args.set, flag="--set")
    if args.out:
        overrides["out"] = args.out
    if args.max_steps is not None:
        overrides["max_steps"] = args.max_steps
    return load(args.config, overrides)


def _rank0() -> bool:
    """Every rank of a `torchrun` meets the same refusal: rank 0 alone says it."""
    return int(os.environ.get("RANK", "0")) == 0


def _refused(message: str) -> int:
    return fail(message) if _rank0() else 2


def _failed(e: SleuthError) -> int:
    """A foreseen failure (bad input, a failed server or worker, a run that cannot go on): its one-line message,
    from one rank only (every rank raises it alike), and its branch's exit status instead of a traceback per rank."""
    if _rank0():
        print(f"error: {one_line(str(e)) or type(e).__name__}", file=sys.stderr)
    return e.exit_code


def _one_line_warnings() -> None:
    """sleuth's own training warnings print as one line (`warning: ...`); others keep Python's format."""
    from sleuth.training.config import TrainingWarning

    shown = warnings.showwarning

    def show(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if issubclass(category, TrainingWarning):
            from tqdm import tqdm

            tqdm.write(f"warning: {message}", file=sys.stderr)  # on a line of its own, above the progress bar
        else:
            shown(message, category, *args, **kwargs)

    warnings.showwarning = show


def _run_training(args: argparse.Namespace, load: Callable[..., Any], trainer_class: Callable[[], Any],
                  done: str, metric: str, env_of: Callable[[Any], tuple[str, dict] | None]) -> int:
    """`sleuth train` and `sleuth sft`: validate the config, the model name and the env (`env_of(cfg)`:
    the env id and args it runs, or None) before anything heavy is imported, build the trainer, train, then
    rank 0 plots the curves (`OUT/training.png`) and says where the run stopped."""
    from sleuth.agents.policies.models import resolve_model
    from sleuth.training.config import TrainConfig

    try:
        cfg = _run_config(args, load)
        resolve_model(cfg.model)  # a typo'd model fails here, before DeepSpeed and the weights load
        if isinstance(cfg, TrainConfig) and cfg.agent.enabled:  # and a missing agent or verifier
            from sleuth.agents.gateway.agent_runner import CommandAgent, load_agent
            from sleuth.verifiers.registry import get_verifier

            if cfg.agent.entrypoint:
                load_agent(cfg.agent.entrypoint, cfg.agent.path)
            else:
                CommandAgent(cfg.agent.command or "", cfg.agent.path, cfg.agent.timeout_s)
            get_verifier(cfg.agent.verifier)
        if isinstance(cfg, TrainConfig) and cfg.verifier is not None:  # an unknown name, a bad judge file
            from sleuth.verifiers.registry import get_verifier, group_verifier

            group_verifier(cfg.verifier) or get_verifier(cfg.verifier)
    except SleuthError as e:
        return _failed(e)
    except (ValueError, LookupError) as e:  # a library's refusal of a value (a model id, a plugin name)
        return _refused(str(e))
    if (env := env_of(cfg)) is not None:
        import sleuth

        try:
            sleuth.make(env[0], **env[1]).close()
        except Exception as e:  # an unknown id or a bad argument, named before minutes of loading
            return _refused(f"cannot build env {env[0]!r}: {type(e).__name__}: {e}")
    _one_line_warnings()
    try:
        trainer = trainer_class()(cfg, resume=args.resume)
    except SleuthError as e:  # a bad config, another run owns --out, no complete checkpoint, Ray unreachable
        return _failed(e)
    except (FileNotFoundError, ValueError) as e:
        return _refused(str(e))
    try:
        rows = trainer.train()
    # held-out questions in SFT data; every episode of a step failed; a rollout server died or its weights could not
    # be verified: the checkpoints so far stay
    except SleuthError as e:
        return _failed(e)
    if trainer.rank == 0:
        from sleuth.training.metrics import plot_run

        if (Path(cfg.out) / "metrics.jsonl").exists():
            plot_run(Path(cfg.out))
        if rows:
            print(f"{done} to step {trainer.step} in {cfg.out}; last {metric} {rows[-1].get(metric, float('nan')):.4f}")
        else:  # resumed a run that had already reached its last step
            print(f"{cfg.out} was already at step {trainer.step}: nothing to train")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from sleuth.training.config import load_config

    def trainer():
        from sleuth.training.rl.trainer import Trainer

        def build(cfg: Any, resume: bool = False) -> Any:
            if cfg.cluster.train_ranks:  # the ranks run as Ray actors; this process only drives them
                from sleuth.training.cluster.train_ranks import RayTrainer

                return RayTrainer(cfg, resume)
            return Trainer(cfg, resume=resume)

        return build

    return _run_training(args, load_config, trainer, "trained", "reward/mean",
                         lambda c: None if c.agent.enabled else (c.env, c.env_args))


def cmd_sft(args: argparse.Namespace) -> int:
    from sleuth.training.sft.trainer import load_sft_config

    def trainer():
        from sleuth.training.sft.trainer import SFTTrainer

        return SFTTrainer

    return _run_training(args, load_sft_config, trainer, "fine-tuned", "loss/nll",
                         lambda c: (c.data.env, c.data.env_args) if c.data.source in ("oracle", "rejection") else None)


def cmd_plot(args: argparse.Namespace) -> int:
    from sleuth.training.metrics import plot_run

    try:
        for p in plot_run(Path(args.run)):
            print(p)
    except FileNotFoundError as e:
        return fail(str(e))
    return 0


EXAMPLES = {"train": "sleuth train --config configs/docread_quick.yaml --out runs/quick --max-steps 5",
            "sft": "sleuth sft --config configs/docread_sft.yaml --out runs/sft"}


def register(sub: Any) -> None:
    """Register `train`, `sft` and `plot` on the `sleuth` subparsers."""
    for name, fn, help_, example in (
            ("train", cmd_train, "train a policy with a YAML config (GRPO family on DeepSpeed ZeRO)",
             "rollout.group_size=8"),
            ("sft", cmd_sft, "supervised fine-tuning on trajectories (oracle, rejection sampling, files, chats)",
             "data.source=rejection")):
        t = command(sub, name, fn, help_, EXAMPLES[name])
        t.add_argument("--config", help="YAML config (configs/*.yaml); every key has a default")
        t.add_argument("--out", help="run directory (overrides the config's out)")
        t.add_argument("--max-steps", type=bounded(int, 1), help="overrides the config's max_steps")
        t.add_argument("--resume", action="store_true", help="continue the run in --out from its newest checkpoint")
        t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help=f"override any config key, e.g. --set {example} (repeatable)")
        t.set_defaults(on_interrupt=ON_INTERRUPT)
    pl = command(sub, "plot", cmd_plot, "plot a training run's metrics to RUN/training.png",
                 example="sleuth plot runs/quick")
    pl.add_argument("run")
