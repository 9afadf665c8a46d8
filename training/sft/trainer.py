"""Supervised fine-tuning on trajectories (`sleuth sft --config X.yaml`): the warm start before RL.

The loss is the mean negative log-likelihood of the policy's own tokens (the trajectory's loss mask: never
prompt, tool or env tokens), on the same DeepSpeed engine as `sleuth train` (ZeRO 0–3, offload, LoRA), with
the same micro-batching over one global denominator, checkpoints, `--resume`, metrics (JSONL, TensorBoard,
`training.png`) and Hugging Face export. Data (`training.sft.data`) is built once per round and written to
`OUT/data/round-R.jsonl`; `rejection` rounds sample from the current weights, so R rounds are R rounds of
expert iteration. Every round's data is checked against the held-out evaluation splits before it trains."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from sleuth.agents.trajectory import Trajectory
from sleuth.core.errors import ConfigError
from sleuth.core.interrupts import HoldUntilStepEnd
from sleuth.training import checkpoint
from sleuth.training.config import CheckpointConfig
from sleuth.training.metrics import WandbConfig
from sleuth.training.rl.batch import micro_batches
from sleuth.training.rl.forward import ScoredForward
from sleuth.training.rl.update import all_max, all_sum
from sleuth.training.run import PROBE, RunDir, load_policy_model
from sleuth.training.sft.data import (
    SOURCES,
    accepted,
    read_chats,
    read_trajectories,
    replay_chats,
    score,
)
from sleuth.training.zero import (
    DeepSpeedConfig,
    device,
    init_distributed,
)


@dataclass
class SFTDataConfig:
    source: str = "oracle"  # oracle | rejection | trajectories | chat | tool_demos (see training.sft_data)
    # source oracle: a scripted policy (`SCRIPTED_POLICIES`): oracle (reads by number), oracle-title (the gold
    # by title), oracle-lexical (reads as the lexical baseline, answers the gold), or a plugin's
    demonstrator: str = "oracle"
    tasks: str = "hotpotqa:train"  # the tasks episodes run on; its source's test split is always held out
    task_limit: int | None = None
    env: str = "DocRead-v0"
    env_args: dict[str, Any] = field(default_factory=lambda: {"harness": "text"})
    path: str | None = None  # trajectories / chat: the file (or datasets directory)
    min_score: float = 1.0  # oracle, rejection, trajectories: keep episodes the verifier scores at least this
    samples: int = 4  # rejection: episodes per task per round
    rounds: int = 1  # rejection: rounds of sample → filter → fine-tune
    temperature: float = 1.0  # rejection sampling
    max_tokens: int = 48  # rejection sampling, per turn
    concurrency: int = 16
    held_out: list[str] = field(default_factory=list)  # more task specs the data must not contain

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"data.source must be one of {', '.join(SOURCES)}; got {self.source!r}")
        if self.source in ("trajectories", "chat") and not self.path:
            raise ValueError(f"data.source {self.source} reads data.path: set it to the file")
        if self.rounds < 1 or self.samples < 1 or self.max_tokens < 1 or self.concurrency < 1:
            raise ValueError("data.rounds, data.samples, data.max_tokens and data.concurrency must be ≥ 1")
        if self.rounds > 1 and self.source != "rejection":
            raise ValueError(f"data.rounds > 1 re-samples from the policy: only source rejection has rounds, "
                             f"not {self.source}")
        from sleuth.agents.policies.load import SCRIPTED_POLICIES

        if self.demonstrator not in SCRIPTED_POLICIES:  # any scripted policy; data.min_score keeps what scored
            SCRIPTED_POLICIES.get(self.demonstrator)  # the "did you mean" error, naming every scripted policy
        if not self.temperature > 0:
            raise ValueError(f"data.temperature must be > 0 for sampling, got {self.temperature}")


@dataclass
class SFTConfig:
    model: str = "smollm2"
    out: str = "runs/sft"
    seed: int = 0
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    epochs: int = 1  # passes over each round's data
    batch_size: int = 8  # trajectories per optimizer step, across all ranks
    max_steps: int | None = None  # stop early (None: every epoch of every round)
    micro_batch_tokens: int = 4096
    packing: bool = True  # as the RL update's `update.packing`: micro-batches run without padding
    deepspeed: DeepSpeedConfig = field(default_factory=lambda: DeepSpeedConfig(lr=5e-5))
    checkpoint: CheckpointConfig = field(default_factory=lambda: CheckpointConfig(every=0))
    tensorboard: bool = True
    wandb: WandbConfig = field(default_factory=WandbConfig)

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1 or self.micro_batch_tokens < 1:
            raise ValueError("epochs, batch_size and micro_batch_tokens must be ≥ 1")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be ≥ 1 (or unset), got {self.max_steps}")


def load_sft_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> SFTConfig:
    from sleuth.training.config import RENAMED
    from sleuth.training.typed_yaml import load_yaml

    return load_yaml(SFTConfig, path, overrides, RENAMED)


def nll_numerator(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ −log π over the masked (policy) tokens; divided by the step's policy-token count across ranks."""
    return -(logp * mask).sum()


class SFTTrainer:
    def __init__(self, cfg: SFTConfig, resume: bool = False, progress: bool = True):
        self.cfg, self.progress = cfg, progress
        self.rank, self.world = init_distributed()
        self.out = Path(cfg.out)
        self.run_dir = RunDir(cfg.out, resume)  # one process (group) per run directory, until train ends
        try:
            self._setup(cfg)
        except BaseException:
            self.run_dir.release()
            raise

    def release(self) -> None:
        """Let another process have the run directory (`train` does at its end)."""
        self.run_dir.release()

    def _setup(self, cfg: SFTConfig) -> None:
        from sleuth.tasks import LeakageError, check_tasks, held_out_specs, load_held_out, load_tasks

        d = cfg.data
        try:
            self.held_out = load_held_out(held_out_specs(d.tasks, d.held_out))
        except LeakageError as e:
            raise ConfigError(str(e)) from None
        self.tasks = (load_tasks(d.tasks, limit=d.task_limit) if d.source in ("oracle", "rejection", "tool_demos")
                      else [])
        try:  # before any model loads; the data each round builds is checked again in `round_data`
            check_tasks(self.tasks, self.held_out, f"data.tasks {d.tasks}")
        except LeakageError as e:
            raise ConfigError(str(e)) from None
        torch.manual_seed(cfg.seed + self.rank)
        self.model = load_policy_model(cfg.model, cfg.deepspeed)
        self.model_path, self.tokenizer, self.engine = self.model.path, self.model.tokenizer, self.model.engine
        self.pad_id = self.model.pad_id
        self.forward = ScoredForward(self.engine, self.engine.module, packed=cfg.packing)
        state = self.run_dir.restore(self.engine)
        self.step = int(state["step"]) if state else 0
        self.saved = self.step  # the step of the newest checkpoint (0: none, or a fresh run)
        self.logger = self.run_dir.open(self.rank, self.step, cfg, cfg.tensorboard, cfg.wandb)
        self._rollout: Any = None

    # -- the loop -------------------------------------------------------------------------------------
    def train(self) -> list[dict[str, Any]]:
        from tqdm import tqdm

        rows: list[dict[str, Any]] = []
        bar = tqdm(desc="sft", initial=self.step, disable=not self.progress or self.rank != 0)
        try:
            with HoldUntilStepEnd() as held:  # SIGINT / SIGTERM: the step in flight finishes and is checkpointed
                return self._train(held, rows, bar)
        finally:
            bar.close()
            if self.logger:
                self.logger.close()
            self.release()

    def _train(self, held: HoldUntilStepEnd, rows: list[dict[str, Any]], bar: Any) -> list[dict[str, Any]]:
        cfg, done = self.cfg, 0
        for r in range(cfg.data.rounds):
            data, data_metrics = self.round_data(r)  # kept in OUT/data: a resumed run reads it back
            self._stop_if_held(held)
            if not data:
                raise ConfigError(f"round {r}: no training data (every episode scored below data.min_score "
                                  f"{cfg.data.min_score}, or the file holds none)")
            bar.total = (bar.total or 0) + cfg.epochs * -(-len(data) // cfg.batch_size)
            bar.refresh()
            for epoch in range(cfg.epochs):
                order = np.random.default_rng([cfg.seed, r, epoch]).permutation(len(data))
                for start in range(0, len(order), cfg.batch_size):
                    done += 1
                    if done <= self.step:  # finished before the checkpoint this run resumed from
                        continue
                    batch = [data[i] for i in order[start:start + cfg.batch_size]]
                    row = {**self.sft_step(batch[self.rank::self.world]), "round": r, "epoch": epoch,
                           **data_metrics}
                    data_metrics = {}
                    self.step = done
                    rows.append(row)
                    if self.logger:
                        self.logger.log(self.step, row)
                    bar.update(1)
                    bar.set_postfix(nll=f"{row['loss/nll']:.3f}")
                    if cfg.checkpoint.every and self.step % cfg.checkpoint.every == 0:
                        self.save()
                    if cfg.max_steps is not None and self.step >= cfg.max_steps:
                        return self._finish(rows)
                    self._stop_if_held(held)
            self.save()  # the next round samples from these weights: a resume must start from them
        return self._finish(rows)

    def _stop_if_held(self, held: HoldUntilStepEnd) -> None:
        """At a step boundary: when any rank holds a signal, checkpoint this step (unless saved) and raise it."""
        if held.stop_now(all_max):
            if self.step > self.saved:
                self.save()
            if self.rank == 0:
                from tqdm import tqdm

                tqdm.write(f"stopped after step {self.step}: checkpoint {checkpoint.tag_of(self.saved)} written",
                           file=sys.stderr)
            raise held.interruption()

    def _finish(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.save()
        if self.cfg.checkpoint.export_hf:
            checkpoint.export_hf(self.engine, self.model_path, self.out / "hf", self.tokenizer)
        return rows

    def save(self) -> None:
        self.run_dir.save(self.engine, self.step, {"step": self.step}, self.cfg.checkpoint.keep)
        self.saved = self.step

    def sft_step(self, trajs: Sequence[Trajectory]) -> dict[str, Any]:
        """One optimizer step on this rank's share of the batch: mean NLL of every policy token in the batch."""
        t0 = time.perf_counter()
        zeros = [np.zeros(t.num_policy_tokens) for t in trajs]
        batches = (micro_batches(list(trajs), zeros, self.pad_id, self.cfg.micro_batch_tokens,
                                 packed=self.forward.uses_packing(),
                                 share=self.forward.shares_prefix()) if trajs else [])
        denom = all_sum(sum(float(b.loss_mask.sum()) for b in batches))
        n_micro = int(all_max(len(batches)))
        dev, scale, nll = device(), dist.get_world_size() / max(denom, 1.0), 0.0
        self.engine.train()
        for i in range(n_micro):
            if i < len(batches):
                b = batches[i].to(dev)
                ids, attn, mask = b.input_ids, b.attention_mask, b.loss_mask
            else:  # keeps this rank in step with the others' collectives
                ids = torch.full((1, 2), self.pad_id, dtype=torch.long, device=dev)
                attn, mask = torch.ones_like(ids), torch.zeros((1, 2), device=dev)
            logp, _ = self.forward(ids, attn, mask).logprobs(ids, mask)
            num = nll_numerator(logp, mask)
            self.engine.backward(num * scale, scale_wrt_gas=False)
            nll += float(num.detach())
        self.engine.step()
        gn = self.engine.get_global_grad_norm()
        tokens = int(all_sum(sum(int(b.attention_mask.sum()) for b in batches)))
        wall = time.perf_counter() - t0
        return {"loss/nll": all_sum(nll) / max(denom, 1.0), "grad_norm": float(gn) if gn is not None else float("nan"),
                "policy_tokens": int(denom), "tokens_per_s": tokens / max(wall, 1e-9), "time/step": wall}

    # -- data -----------------------------------------------------------------------------------------
    def round_data(self, r: int) -> tuple[list[Trajectory], dict[str, float]]:
        """The round's training trajectories (read back from `OUT/data/round-R.jsonl` when a resumed run
        built them already) and what building them measured."""
        from sleuth.tasks import LeakageError, check_texts

        path = self.out / "data" / f"round-{r}.jsonl"
        metrics: dict[str, float] = {}
        if path.exists():
            data = read_trajectories(path)
        else:
            data, metrics = self._build(r)
            if self.rank == 0:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("".join(t.to_json() + "\n" for t in data), encoding="utf-8")
            dist.barrier()
        try:  # the held-out check runs on every round's data, file-based or sampled
            check_texts([(t.task_id, self.tokenizer.decode(t.token_ids())) for t in data], self.held_out,
                        f"SFT data round {r}")
        except LeakageError as e:
            raise ConfigError(str(e)) from None
        return data, metrics

    def _build(self, r: int) -> tuple[list[Trajectory], dict[str, float]]:
        d = self.cfg.data
        if d.source == "chat":
            return replay_chats(read_chats(d.path), self.tokenizer), {}
        if d.source == "tool_demos":
            from sleuth.training.sft.tool_demos import tool_demo

            return replay_chats([tool_demo(t, self.cfg.seed) for t in self.tasks], self.tokenizer), {}
        if d.source == "trajectories":
            everything = read_trajectories(d.path)
            kept = accepted(everything, d.min_score)
            return kept, {"data/accept_rate": len(kept) / max(len(everything), 1), "data/accepted": len(kept)}
        if d.source == "oracle":
            from sleuth.agents.policies.load import load_policy

            policy = load_policy(d.demonstrator, tokenizer_model=self.model_path)
            sampled = self._episodes(policy, [t for t in self.tasks[self.rank::self.world]], r)
        else:
            sampled = self._episodes(self._policy(), [t for t in self.tasks[self.rank::self.world]
                                                      for _ in range(d.samples)], r)
        kept = accepted(sampled, d.min_score)
        parts: list[Any] = [None] * self.world
        dist.all_gather_object(parts, ([t.to_dict() for t in kept], [score(t) for t in sampled]))
        kept = [Trajectory.from_dict(t) for p in parts for t in p[0]]
        scores = [s for p in parts for s in p[1]]
        return kept, {"data/accepted": len(kept), "data/sampled": len(scores),
                      "data/accept_rate": len(kept) / max(len(scores), 1),
                      "data/sampled_score": float(np.mean(scores)) if scores else 0.0}

    def _policy(self) -> Any:
        """The rejection sampler: a transformers engine running the current weights (the trainer's module itself
        where it holds whole weights, else a copy whose sync is verified)."""
        from sleuth.agents.chat import ChatRenderer
        from sleuth.training.rollout.in_process import SharedRollout, TransformersRollout
        from sleuth.training.zero import holds_whole_weights

        if self._rollout is None and holds_whole_weights(self.cfg.deepspeed):
            self._rollout = SharedRollout(self.engine.module, self.model_path, str(device()),
                                          max_batch=self.cfg.data.concurrency)
        elif self._rollout is None:
            self._rollout = TransformersRollout(self.model_path, str(device()), self.model.dtype,
                                                ChatRenderer(self.tokenizer).prompt_ids(PROBE), 1e-3,
                                                max_batch=self.cfg.data.concurrency)
        self._rollout.sync(self.engine.module)
        return self._rollout.policy

    def _episodes(self, policy: Any, tasks: list[Any], r: int) -> list[Trajectory]:
        from tqdm import tqdm

        import sleuth
        from sleuth.agents.loop.episodes import run_episodes
        from sleuth.agents.policies.base import SamplingParams

        d = self.cfg.data
        seed = (self.cfg.seed * 1_000_003 + r * 1009 + self.rank) % (2**31)
        sampling = SamplingParams(max_tokens=d.max_tokens, temperature=d.temperature, seed=seed)
        episodes = run_episodes(lambda: sleuth.make(d.env, **d.env_args), tasks, policy, sampling, d.concurrency,
                                env_id=d.env)
        trajs = list(tqdm(episodes, total=len(tasks), desc=f"{d.source} round {r}",
                          disable=not self.progress or self.rank != 0))
        for t in trajs:
            t.meta["sft_source"] = f"{d.source} round {r}"
        return trajs
