"""The trainer loop. Each step: rollouts from the agent loop (each rank runs its share of the step's
task groups) → advantages from the configured estimator → one policy update on the DeepSpeed engine →
weight sync to the rollout engine, verified → metrics, checkpoint. With `rollout.max_staleness` ≥ 1 the
rollouts come from a `RolloutStream` that samples while the update runs (asynchronous training).

An episode that failed on infrastructure (`Trajectory.failed`) is no outcome of the policy: its whole group leaves
the update, counted (`episodes/failed`, `groups/dropped_failed`) and still written to the rollouts file. A step
whose every episode failed is an outage: sampled again after a backoff (`rollout.outage_retries`, `outage/*`), it
stops the run (`training.rl.failures`) when the last retry fails too. SIGINT and SIGTERM are held until the step in
flight has finished, checkpointed, then raised (`sleuth.core.interrupts`). A step whose update had no learning
signal (every advantage 0, or a zero gradient) is flagged (`no_signal`) and warned about once, with the count at
the end of the run."""

from __future__ import annotations

import sys
import time
import warnings
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import gymnasium
import numpy as np
import torch
import torch.distributed as dist

from sleuth.agents.eval.rescore import Rescorer
from sleuth.agents.policies.base import SamplingParams
from sleuth.agents.policies.requests import WeightsGate
from sleuth.agents.trajectory import Trajectory
from sleuth.core.errors import ConfigError
from sleuth.core.interrupts import HoldUntilStepEnd
from sleuth.tasks.base import Task
from sleuth.training import checkpoint
from sleuth.training.cluster.env_actors import EnvPool
from sleuth.training.config import TrainConfig, TrainingWarning
from sleuth.training.distill.load import load_teacher
from sleuth.training.metrics import MISMATCH_WARN
from sleuth.training.rl.branching import BranchRounds
from sleuth.training.rl.collected import Collected
from sleuth.training.rl.failures import FailureWatch
from sleuth.training.rl.records import write_credit, write_rollouts
from sleuth.training.rl.rounds import episode_round, round_seed, sampling
from sleuth.training.rl.step_metrics import Outage, StepPart, components, ranges, step_row, why_no_signal
from sleuth.training.rl.task_order import TaskSampler
from sleuth.training.rl.update import PolicyUpdater, all_max, all_sum
from sleuth.training.rollout.agent import AgentRollouts
from sleuth.training.rollout.asynchronous import RolloutStream
from sleuth.training.rollout.factory import make_rollout, self_play_args
from sleuth.training.rollout.in_process import RolloutEngine, WeightSyncError
from sleuth.training.run import PROBE, RunDir, load_policy_model, load_reference, training_tasks
from sleuth.training.zero import full_state_dict, init_distributed
from sleuth.verifiers.judge import JudgeStats

T = TypeVar("T")
NO_SIGNAL_ADVICE = ("raise rollout.group_size or rollout.temperature, add a step reward (algorithm.estimator: "
                    "info_gain), or sample more groups (rollout.zero_variance: dynamic)")


class Trainer:
    def __init__(self, cfg: TrainConfig, resume: bool = False, progress: bool = True):
        self.cfg, self.progress = cfg, progress
        self.rank, self.world = init_distributed()
        self.out = Path(cfg.out)
        self.agent: AgentRollouts | None = None
        self.envs: EnvPool | None = None
        self.rollout: RolloutEngine | None = None
        for key, n in (("rollout.tasks_per_step", cfg.rollout.tasks_per_step),
                       ("branches.demo_tasks", cfg.branches.demo_tasks)):
            if n % self.world:
                raise ConfigError(f"{key} ({n}) must be a multiple of the number of processes "
                                  f"({self.world}): each rank trains on whole groups")
        self.run_dir = RunDir(cfg.out, resume)  # one process (group) per run directory, until train ends
        try:
            self._setup(cfg)
        except BaseException:
            for part in (self.agent, self.envs, self.rollout):  # e.g. a checkpoint that cannot be restored
                if part is not None:
                    part.close()
            self.run_dir.release()
            raise

    def release(self) -> None:
        """Let another process have the run directory (`train` does at its end)."""
        self.run_dir.release()

    def _setup(self, cfg: TrainConfig) -> None:
        from sleuth import rewards
        from sleuth.agents.chat import ChatRenderer

        torch.manual_seed(cfg.seed + self.rank)
        self.estimator = rewards.make(cfg.algorithm.estimator, **cfg.algorithm.estimator_args)
        self.tasks = training_tasks(cfg)
        self.tasks_by_id = {t.id: t for t in self.tasks}
        # the config's `verifier` scores each round's episodes again (a judge: pointwise, or a group at once)
        self.rescorer = Rescorer(cfg.verifier, self.tasks_by_id, cfg.rollout.concurrency) if cfg.verifier else None
        self.sampler = TaskSampler(len(self.tasks), cfg.seed)
        self.model = load_policy_model(cfg.model, cfg.deepspeed, vllm_rollout=cfg.rollout.inference == "vllm")
        self.model_path, self.tokenizer, self.engine = self.model.path, self.model.tokenizer, self.model.engine
        try:
            self.estimator.check_policy(self.tokenizer)
        except ValueError as e:
            raise ConfigError(f"algorithm.estimator {cfg.algorithm.estimator!r}: {e}") from None
        self.branches = BranchRounds(cfg.branches, cfg.rollout, cfg.env, self.tokenizer, cfg.seed)
        self.mismatch_warned = False
        self.no_signal_steps: list[int] = []
        self.failures = FailureWatch(cfg.rollout.max_consecutive_failures)
        temperature = cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0
        mixing = None
        if self.estimator.mixing is not None:  # gear_mix: the trainer mixes its granularities per token
            from sleuth.training.rl.mixing import Mixing

            mixing = Mixing(self.estimator.mixing, self.engine.module, self.model.hidden_size, temperature,
                            cfg.update.packing)
        distill = cfg.algorithm.distill
        self.teacher = load_teacher(distill, self.model, cfg.update.packing, cfg.update.logit_chunk,
                                    cfg.update.micro_batch_tokens) if distill.enabled else None
        self.updater = PolicyUpdater(self.engine, cfg.update, cfg.loss, self.model.pad_id,
                                     ref=load_reference(self.model) if cfg.loss.kl_coef > 0 else None,
                                     temperature=temperature, mixing=mixing, seed=cfg.seed + self.rank,
                                     distill=distill)
        self.probe_ids = ChatRenderer(self.tokenizer).prompt_ids(PROBE)
        self.rollout = make_rollout(cfg.rollout, cfg.cluster, cfg.update, cfg.deepspeed, self.engine.module,
                                    self.model_path, self.model.dtype, self.probe_ids, self.world)
        self.make_env = self._env_factory()
        self.step, version = 0, 0
        self.replay: deque[list[str]] = deque()  # task ids of the steps a killed stream had issued (see `save`)
        state = self.run_dir.restore(self.engine)
        if state is not None:
            self.step, version = int(state["step"]), int(state["policy_version"])
            self.sampler.load(state["sampler"])
            self.replay = deque(state.get("stream_ahead", [[]] * self.world)[self.rank])
        self.saved = self.step  # the step of the newest checkpoint (0: none, or a fresh run)
        if self.estimator.refresh_due(0):  # a reader that tracks the policy starts as the policy (or its checkpoint)
            self.estimator.refresh(full_state_dict(self.engine.module))
        self.rollout.sync(self.engine.module)  # verified, also at a fresh start: the engine must match
        self.rollout.policy.version = version
        self.gate = WeightsGate()
        self.stream = self._stream() if cfg.rollout.max_staleness > 0 else None
        self.agent = self._agent() if cfg.agent.enabled else None
        self.logger = self.run_dir.open(self.rank, self.step, cfg, cfg.tensorboard, cfg.wandb)

    # -- the loop -------------------------------------------------------------------------------------
    def train(self) -> list[dict[str, Any]]:
        from tqdm import tqdm

        rows = []
        cfg = self.cfg
        bar = tqdm(total=cfg.max_steps, initial=self.step, desc="train", disable=not self.progress or self.rank != 0)
        first = self.step + 1
        try:
            with HoldUntilStepEnd() as held:  # SIGINT / SIGTERM: the step in flight finishes and is checkpointed
                while self.step < cfg.max_steps:
                    row = self.train_step(held)
                    rows.append(row)
                    bar.update(1)
                    bar.set_postfix(reward=f"{row.get('reward/mean', float('nan')):.3f}",
                                    loss=f"{row.get('loss/policy', float('nan')):.4f}")
                    every, stop = cfg.checkpoint.every, held.stop_now(all_max)
                    if (every and self.step % every == 0) or self.step == cfg.max_steps or stop:
                        self.save()
                    if stop and self.step < cfg.max_steps:
                        if self.rank == 0:
                            tqdm.write(f"stopped after step {self.step}: checkpoint {checkpoint.tag_of(self.step)} "
                                       "written", file=sys.stderr)
                        raise held.interruption()
            if self.no_signal_steps and self.rank == 0:
                n = len(self.no_signal_steps)
                warnings.warn(f"{n} of the {self.step - first + 1} steps trained had no learning signal "
                              f"(step{'s' if n > 1 else ''} {ranges(self.no_signal_steps)}): {NO_SIGNAL_ADVICE}",
                              TrainingWarning, stacklevel=2)
            if cfg.checkpoint.export_hf:
                checkpoint.export_hf(self.engine, self.model_path, self.out / "hf", self.tokenizer)
        finally:
            bar.close()
            if self.logger:
                self.logger.close()
            if self.stream is not None:
                self.stream.close()
            if self.agent is not None:
                self.agent.close()
            if self.envs is not None:
                self.envs.close()
            self.rollout.close()
            self.run_dir.release()
        return rows

    def save(self) -> None:
        # under a rollout stream, each rank's steps issued ahead of the trainer: the resumed run issues them first
        ahead = _gather(self.stream.issued_ahead() if self.stream is not None else [])
        state = {"step": self.step, "sampler": self.sampler.state(), "policy_version": self.rollout.policy.version,
                 "stream_ahead": ahead}
        self.run_dir.save(self.engine, self.step, state, self.cfg.checkpoint.keep)
        self.saved = self.step

    def train_step(self, held: HoldUntilStepEnd | None = None) -> dict[str, Any]:
        from sleuth.rewards.base import groups

        step = self.step + 1
        t0, cpu0 = time.perf_counter(), time.process_time()
        got, outage = self._collect_through_outage(step, held)
        kept, seen = got.kept, got.seen
        write_rollouts(self.out, step, self.rank, seen)
        self.failures.check(step, seen)
        ok = [t for t in seen if not t.failed and not t.branch_at]  # a failed episode has no outcome
        t2 = time.perf_counter()
        t1 = t2 - got.reward_s
        advantages = got.advantages
        write_credit(self.out, step, self.rank, seen, kept, advantages)
        teacher = self.teacher.score(kept, self.tasks_by_id) if self.teacher is not None else None
        t_teacher = time.perf_counter() - t2
        upd = self.updater.update(kept, advantages, teacher)
        t3 = time.perf_counter()
        sync = {**self._sync(), **(self.envs.stats() if self.envs is not None else {})}
        if self.estimator.refresh_due(step):  # e.g. the information-gain reader becomes a snapshot of the policy
            self.estimator.refresh(full_state_dict(self.engine.module))
        t4 = time.perf_counter()
        self.step = step
        part = StepPart(
            update=upd, rewards=[t.reward for t in ok], truncated=[float(t.truncated) for t in ok],
            success=[float(t.reward > 0) for t in ok],
            length_correct=[t.num_policy_tokens for t in ok if t.reward > 0],
            length_wrong=[t.num_policy_tokens for t in ok if t.reward <= 0],
            components={**components(ok), **got.estimator_metrics},
            # per policy token, the advantage the loss used (for gear_mix: the mixed one, from the update)
            adv=upd.mixed_adv or [float(x) for a in advantages for x in np.asarray(a).reshape(-1)],
            groups=len(groups([t for t in seen if not t.branch_at])), zero_var=dict(got.zero_var),
            no_signal_groups=got.no_signal_groups, gen_tokens=sum(t.num_policy_tokens for t in seen),
            failed=sum(t.failed and not t.branch_at for t in seen),
            dropped_failed=got.dropped_failed, reissued=got.reissued, stream=got.stream,
            branches=got.branches, demos=got.demos, outage=outage)
        # step_cpu: this process's CPU seconds over the step, all its threads (episodes per CPU-minute is
        # what a CPU run is limited by); a vLLM server's own are not in it
        times = {"rollout": t1 - t0, "reward": t2 - t1, "update": t3 - t2 - t_teacher, "sync": t4 - t3,
                 "step_cpu": time.process_time() - cpu0}
        if self.teacher is not None:
            times["teacher"] = t_teacher
        row = step_row(_gather(part), times, sync, self.cfg.loss.rollout_is != "none", self.rollout.policy.version,
                       self.cfg.rollout.group_size)
        judged = self.rescorer.take_stats() if self.rescorer is not None else None
        if judged is not None:  # the judge's calls, tokens and failures over the step, all ranks
            row.update(JudgeStats.total(_gather(judged)).metrics())
        # no learning signal: nothing the reward said reached the weights (no trajectory kept, every advantage 0,
        # or a gradient of exactly 0); the same decision on every rank (the row is global)
        # (a teacher's signal is no advantage of the estimator's: with one, only a zero gradient is no signal)
        row["no_signal"] = float((not row["adv/absmax"] > 0 and self.teacher is None) or row["grad_norm"] == 0)
        if row["no_signal"]:
            self.no_signal_steps.append(step)
            if len(self.no_signal_steps) == 1 and self.rank == 0:
                warnings.warn(f"step {step}: no learning signal ({why_no_signal(row)}): the update moved nothing "
                              f"towards the reward; {NO_SIGNAL_ADVICE}", TrainingWarning, stacklevel=2)
        if self.logger:
            self.logger.log(step, row)
            # once a run (the metric is in every row); stale by design under max_staleness
            if row.get("mismatch/mean", 0) > MISMATCH_WARN and not self.cfg.rollout.max_staleness \
                    and not self.mismatch_warned:
                self.mismatch_warned = True
                warnings.warn(f"step {step}: mean |Δlogp| between rollout engine and trainer is "
                              f"{row['mismatch/mean']:.4f} (> {MISMATCH_WARN}): the policy gradient is off-policy "
                              "(loss.rollout_is corrects it; bf16 engines round the two apart by ~0.02)",
                              stacklevel=1)
        return row

    def _collect_through_outage(self, step: int, held: HoldUntilStepEnd | None) -> tuple[Collected, Outage]:
        """The step's rollouts; a step whose every episode failed on infrastructure (every env worker or server lost
        at once, a network blip) is sampled again after `rollout.outage_backoff_s`, doubling, up to
        `rollout.outage_retries` times, and counted. A signal held meanwhile stops the wait: the step is abandoned,
        and the checkpoint written is of the step before it (as it stood when this step began)."""
        rc = self.cfg.rollout
        before = (self.sampler.state(), checkpoint.rng_state())
        got, outage = self.collect(step), Outage()
        while outage.retries < rc.outage_retries and self.failures.all_failed(got.seen):
            wait = rc.outage_backoff_s * 2 ** outage.retries
            outage.retries += 1
            outage.failed += len(got.seen)
            reason, line = self.failures.first_failure(got.seen)
            if self.rank == 0:
                warnings.warn(f"step {step}: all {int(all_sum(len(got.seen)))} episodes failed ({reason}: {line}); "
                              f"sampling the step again in {wait:g}s (retry {outage.retries} of "
                              f"rollout.outage_retries {rc.outage_retries})", TrainingWarning, stacklevel=2)
            if held is None:
                time.sleep(wait)
            elif held.wait(wait, all_max):  # a signal came: the step cannot finish
                self._stop_in_outage(step, before, held)
            outage.wait_s += wait
            got = self.collect(step)
        return got, outage

    def _stop_in_outage(self, step: int, before: tuple[dict[str, Any], dict[str, Any]],
                        held: HoldUntilStepEnd) -> None:
        """Abandon step `step` for a signal: checkpoint the step before it as it stood when `step` began (its data
        position and RNG state) unless that is saved already; under a rollout stream, whose tasks issued ahead moved
        on, the last checkpoint stays instead."""
        if self.stream is None and self.step > self.saved:
            self.sampler.load(before[0])
            checkpoint.set_rng_state(before[1])
            self.save()
        if self.rank == 0:
            from tqdm import tqdm

            tqdm.write(f"stopped in step {step}'s outage: the last checkpoint is {checkpoint.tag_of(self.saved)}",
                       file=sys.stderr)
        raise held.interruption()

    def _sync(self) -> dict[str, float]:
        """The verified weight sync; under a rollout stream it first waits for the generate calls in flight
        (new ones wait for it), at most `rollout.sync_timeout_s`."""
        try:
            with self.gate.update(self.cfg.rollout.sync_timeout_s):
                return self.rollout.sync(self.engine.module)
        except TimeoutError as e:
            raise WeightSyncError(f"weight sync timed out waiting for the rollout engine: {e} "
                                  "(rollout.sync_timeout_s)") from None

    # -- rollouts -------------------------------------------------------------------------------------
    def _env_factory(self) -> Callable[[], gymnasium.Env]:
        """Envs in this process, or sessions in Ray env workers (`cluster.env_actors`)."""
        import sleuth

        cfg = self.cfg
        env_args = self_play_args(cfg.env_args, self.rollout, cfg.rollout)
        if cfg.cluster.backend == "ray" and cfg.cluster.env_actors:
            from sleuth.training.cluster.env_actors import EnvPool

            self.envs = EnvPool(cfg.cluster, cfg.env, env_args)
            return self.envs.make
        return lambda: sleuth.make(cfg.env, **env_args)

    def _stream(self) -> RolloutStream:
        rc, cfg = self.cfg.rollout, self.cfg

        def next_tasks() -> list[Task]:
            if self.replay:  # issued before the checkpoint this run resumed from, never taken: issued again first
                return [self.tasks_by_id[i] for i in self.replay.popleft()]
            return self._draw(rc.tasks_per_step)

        params = sampling(rc, cfg.seed * 1_000_003 + self.rank)
        return RolloutStream(self.make_env, next_tasks, self.rollout.policy, params, group_size=rc.group_size,
                             concurrency=rc.concurrency, max_staleness=rc.max_staleness, env_id=cfg.env,
                             env_threads=rc.env_threads, gate=self.gate, episode_timeout_s=rc.episode_timeout_s)

    def collect(self, step: int) -> Collected:
        """This rank's trajectories for the update and their advantages (`Collected`): groups without a
        learning signal kept, dropped, or replaced by more sampling as configured; a group that lost an
        episode to an infrastructure failure sampled once more (`dynamic` also replaces what is missing)."""
        from sleuth.rewards.base import groups

        rc = self.cfg.rollout
        got = Collected(self.estimator, self.tasks_by_id, keep_no_signal=rc.zero_variance == "keep",
                        rescore=self.rescorer)
        rounds = rc.dynamic_max_rounds if rc.zero_variance == "dynamic" else 1
        for round_ in range(rounds):
            if self.stream is not None:
                taken = self.stream.take(rc.tasks_per_step // self.world, self.rollout.policy.version)
                trajs = taken.trajs + taken.failed
                got.stream, got.reissued = taken.stats, got.reissued + taken.reissued
            else:
                chosen = self._draw(rc.tasks_per_step)
                trajs = self._rollout_round(step, round_, chosen)
            failed = got.take(trajs)
            if failed and self.stream is None:  # an infrastructure failure: those tasks are sampled once more
                got.reissued += len(failed)
                again = self._rollout_round(step, round_, failed, reissue=True)
                got.take(again)
                trajs = trajs + again
            got.take(self.branches.answers(self.make_env, trajs, self.tasks_by_id, self.rollout.policy,
                                           self._sampling(step, round_, 4099)))
            if self.cfg.branches.demo:  # the config refuses them under a stream
                bc = self.cfg.branches
                starts = self._draw(bc.demo_tasks) if bc.demo_tasks else chosen
                got.take(self.branches.demos(self.make_env, starts, self.rollout.policy,
                                             self._sampling(step, round_, 6151), f"{step}.{round_}"), demos=True)
            if rc.zero_variance != "dynamic" or all_sum(len(groups([t for t in got.kept if not t.branch_at]))) \
                    >= rc.tasks_per_step:
                break
        return got

    def _draw(self, n: int) -> list[Task]:  # this rank's share of the sampler's next `n` (every rank draws alike)
        return [self.tasks[i] for i in self.sampler.take(n)[self.rank::self.world]]

    def _agent(self) -> AgentRollouts:  # a user's agent through the gateway (`agent:`) instead of an env
        params = sampling(self.cfg.rollout, self.cfg.seed * 1_000_003 + self.rank)
        return AgentRollouts(self.cfg.agent, self.rollout.policy, self.gate, params, self.cfg.rollout.episode_timeout_s)

    def _rollout_round(self, step: int, round_: int, chosen: list[Task], reissue: bool = False) -> list[Trajectory]:
        """Round `round_`'s groups for `chosen` (`reissue`: again, for the groups an infrastructure failure took)."""
        label = f"{round_}r" if reissue else str(round_)
        return episode_round(self.make_env, self.rollout.policy, self.agent, self.cfg.rollout, self.cfg.env, chosen,
                             f"{step}.{label}", self._sampling(step, round_, reissue * 7919))

    def _sampling(self, step: int, round_: int, salt: int) -> SamplingParams:
        return sampling(self.cfg.rollout, round_seed(self.cfg.seed, self.rank, step, round_, salt))


def _gather(obj: T) -> list[T]:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
