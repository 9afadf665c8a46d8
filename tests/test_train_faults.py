"""Training under faults: every failure of `sleuth train` / `sleuth sft` ends in one line that says what to do
(never a traceback), failed episodes never train, a run that cannot learn says so, checkpoints survive a
kill mid-write and a damaged file, one process owns a run directory, and Ctrl-C says how to continue.

Faults are real: task data with its documents cut, SIGKILL during a checkpoint write, a truncated checkpoint
file, a second process on the same --out, SIGINT. The runs no signal reaches run in this process, as the command
line runs them (`procs.sleuth_here`): a new interpreter's startup is most of a tiny run's time."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import sleuth_here, wait_for

from sleuth.agents.trajectory import Trajectory, Turn
from sleuth.core.errors import ConfigError
from sleuth.training.config import load_config
from sleuth.training.metrics import read_metrics
from sleuth.training.zero import DIST_VARS

ENV = {k: v for k, v in os.environ.items() if k not in DIST_VARS} | {"OMP_NUM_THREADS": "1"}


def tiny_args(tiny_model_dir, *more):
    """`sleuth train` on the tiny model at the smallest settings the trainer tests use."""
    return ["--set", f"model={tiny_model_dir}", "--set", "env_args={harness: text}", "--set", "task_limit=24",
            "--set", "rollout.max_tokens=12", "--set", "rollout.group_size=2", "--set", "checkpoint.export_hf=false",
            "--set", "tensorboard=false", "--set", "deepspeed.dtype=fp32", *more]


def sleuth(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "sleuth.cli", *map(str, args)], env=ENV, capture_output=True,
                          text=True, timeout=timeout)


def start(args, log: Path, python=(sys.executable, "-m", "sleuth.cli"), **env):
    """A `sleuth` process in its own session, stderr to `log` (a pipe nobody reads would block it). SIGINT is
    reset to its default in the child: a suite started in the background inherits it ignored."""
    return subprocess.Popen([*python, *map(str, args)], env=ENV | env, stdout=subprocess.DEVNULL,
                            stderr=open(log, "w"), start_new_session=True,  # noqa: SIM115
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def errors(stderr: str) -> list[str]:
    """The failure lines; a traceback anywhere fails the test."""
    assert "Traceback" not in stderr and "[rank0]" not in stderr, stderr[-3000:]
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def hotpot_file(data_dir: Path, path: Path, n: int, cut: set[int] = frozenset()) -> str:
    """The first `n` HotpotQA train records as a task file; the records in `cut` lost their documents (a
    damaged data file: DocRead cannot reset on them). Returns the task spec."""
    lines = (data_dir / "hotpotqa" / "train.jsonl").read_text().splitlines()[:n]
    recs = [json.loads(line) for line in lines]
    for i in cut:
        recs[i]["context"] = {"title": [], "sentences": []}
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return f"hotpotqa:{path}"


# -- configs that cannot learn ----------------------------------------------------------------------------
def test_group_size_1_with_a_group_relative_estimator_is_refused_before_anything_loads(tmp_path):
    t = time.perf_counter()
    proc = sleuth("train", "--out", tmp_path / "run", "--set", "rollout.group_size=1")
    assert proc.returncode == 2
    [line] = errors(proc.stderr)
    assert "rollout.group_size 1" in line and "'grpo'" in line and "every advantage is 0" in line
    assert time.perf_counter() - t < 30 and not (tmp_path / "run").exists()  # no model loaded, nothing written


def test_every_shipped_estimator_declares_itself_group_relative_and_a_lone_one_may_train_alone():
    from sleuth import rewards
    from sleuth.rewards.base import ESTIMATORS, Advantages, Estimator, per_token

    for name in rewards.names():
        if name == "none":  # no advantage at all: pure on-policy distillation, where a lone episode has its signal
            assert load_config(overrides={"rollout.group_size": 1, "algorithm.estimator": name,
                                          "algorithm.distill.teacher": "smollm2"})
            continue
        with pytest.raises(ConfigError, match="rollout.group_size 1"):
            load_config(overrides={"rollout.group_size": 1, "algorithm.estimator": name})

    @rewards.register("_absolute")
    class Absolute(Estimator):  # the reward itself: a lone episode has its signal
        group_relative = False

        def __call__(self, trajs, tasks):
            return Advantages([per_token(t, t.reward) for t in trajs])

    try:
        assert load_config(overrides={"rollout.group_size": 1, "algorithm.estimator": "_absolute"})
    finally:
        ESTIMATORS.unregister("_absolute")


def test_the_quick_recipe_without_reward_warns_once_and_counts_the_steps(tiny_model_dir, tmp_path, capfd):
    """README's quick recipe (configs/docread_quick.yaml: grpo, 2 tasks × 4 episodes, zero_variance keep) on a
    policy that never scores: every group has zero variance, every advantage is 0. The run says so at the
    first such step and counts them at the end, one line each."""
    out = tmp_path / "quick"
    proc = sleuth_here("train", "--config", "docread_quick", "--out", out, "--max-steps", 2,
                       "--set", f"model={tiny_model_dir}", "--set", "task_limit=8", "--set", "rollout.max_tokens=12",
                       "--set", "checkpoint.export_hf=false", "--set", "tensorboard=false",
                       "--set", "deepspeed.dtype=fp32", capfd=capfd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warned = [line for line in proc.stderr.splitlines() if "no learning signal" in line]
    assert len(warned) == 2, proc.stderr[-3000:]
    assert warned[0].startswith("warning: step 1: no learning signal (every advantage was 0; 100% of the groups")
    assert warned[1].startswith("warning: 2 of the 2 steps trained had no learning signal (steps 1-2)")
    assert all("rollout.group_size" in w and "info_gain" in w and "zero_variance: dynamic" in w for w in warned)
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["no_signal"] for r in rows] == [1.0, 1.0] and all(r["adv/absmax"] == 0 for r in rows)


# -- failed episodes --------------------------------------------------------------------------------------
def _cfg(tiny_model_dir, out, tasks, **over):
    base = {"model": tiny_model_dir, "out": str(out), "env_args": {"harness": "text"}, "tasks": tasks,
            "rollout.max_tokens": 12, "rollout.tasks_per_step": 2, "rollout.group_size": 2,
            "rollout.temperature": 0.7, "checkpoint.export_hf": False, "tensorboard": False,
            "deepspeed.lr": 1e-3, "loss.entropy_coef": 0.01}
    return load_config(overrides=base | over)


def test_a_group_with_a_failed_episode_never_trains_and_is_counted(tiny_model_dir, tmp_path, data_dir):
    """Two tasks, one whose documents were cut from the data file: its episodes fail at reset. The group
    is sampled once more in the same step (an infrastructure failure may pass), fails again, leaves the
    update, is counted, stays out of the reward metrics, and is still in the rollouts file."""
    from sleuth.training.rl.trainer import Trainer

    tasks = hotpot_file(data_dir, tmp_path / "cut.jsonl", 2, cut={1})
    trainer = Trainer(_cfg(tiny_model_dir, tmp_path / "run", tasks, max_steps=1), progress=False)
    got = trainer.collect(1)
    assert len(got.seen) == 6 and sum(t.failed for t in got.seen) == 4 and got.dropped_failed == 2
    assert got.reissued == 1 and len(got.kept) == 2 and not any(t.failed for t in got.kept)
    assert {t.stop_reason for t in got.seen if t.failed} == {"reset_error"}
    [row] = trainer.train()
    assert row["episodes/failed"] == 4 and row["groups/dropped_failed"] == 2 and row["groups/reissued"] == 1
    assert row["episodes/sampled"] == 6  # the step's rollout budget: both groups, and the reissued one
    assert row["groups/zero_var_wrong"] == 1 / 3  # the intact group of three: the untrained model scores 0
    rollouts = (tmp_path / "run" / "rollouts" / "step-000001.rank0.jsonl").read_text()
    lines = [json.loads(x) for x in rollouts.splitlines()]
    assert len(lines) == 6 and sum(x["error"] is not None for x in lines) == 4


def test_dynamic_sampling_refills_the_groups_a_failure_took(tiny_model_dir, tmp_path, data_dir, monkeypatch):
    """Unit test of `collect` around the rollout: round 0 brings one group with signal and one with a failed
    episode, whose task is sampled again at once and fails again; round 1 two groups with signal; `dynamic`
    samples round 1 because the failures left the step short, and no failed group reaches the update."""
    from sleuth.training.rl.trainer import Trainer

    tasks = hotpot_file(data_dir, tmp_path / "ok.jsonl", 2)
    trainer = Trainer(_cfg(tiny_model_dir, tmp_path / "run", tasks, **{"rollout.zero_variance": "dynamic"}),
                      progress=False)

    def traj(group, reward, error=None):
        return Trajectory(group, "DocRead-v0", [1, 2], turns=[] if error else [Turn([3], [0.0], "a")],
                          reward=reward, group=group, error=error, stop_reason="env_error" if error else "final")

    from sleuth.tasks.base import Task

    failed = "env failed: EOFError"
    rounds = {(0, False): [traj("a", 1.0), traj("a", 0.0), traj("b", 1.0), traj("b", 0.0, error=failed)],
              (0, True): [traj("b", 1.0, error=failed), traj("b", 0.0)],
              (1, False): [traj("c", 1.0), traj("c", 0.0), traj("d", 0.0), traj("d", 1.0)]}
    asked = []

    def round_(step, r, chosen, reissue=False):
        asked.append((r, reissue, [t.id for t in chosen]))
        return rounds[(r, reissue)]

    trainer.tasks_by_id = {k: Task(k, "q?", "a") for k in "abcd"}
    monkeypatch.setattr(trainer, "_rollout_round", round_)
    got = trainer.collect(1)
    assert asked[1] == (0, True, ["b"])  # only the failed group's task, sampled again
    assert got.dropped_failed == 2 and got.reissued == 1 and len(got.seen) == 10
    assert [t.group for t in got.kept] == ["a", "a", "c", "c", "d", "d"]


def test_a_step_whose_every_episode_failed_stops_the_run_in_one_line(tiny_model_dir, tmp_path, data_dir, capfd):
    """The task file loses its documents between two runs: the resumed run's step fails whole and stops
    with one line; the checkpoint of the step before stays, and the run resumes from it once the data is
    back."""
    path = tmp_path / "tasks.jsonl"
    tasks = hotpot_file(data_dir, path, 2)
    out = tmp_path / "run"
    args = ["--out", out, *tiny_args(tiny_model_dir, "--set", f"tasks={tasks}")]
    assert sleuth_here("train", *args, "--max-steps", 1, capfd=capfd).returncode == 0
    hotpot_file(data_dir, path, 2, cut={0, 1})
    # sampled again once after a short wait, as an outage would be, then the run stops
    proc = sleuth_here("train", *args, "--max-steps", 2, "--resume", "--set", "rollout.outage_retries=1",
                       "--set", "rollout.outage_backoff_s=0.1", capfd=capfd)
    assert proc.returncode == 1
    assert "warning: step 2: all 8 episodes failed (reset_error: " in proc.stderr
    assert "sampling the step again in 0.1s (retry 1 of rollout.outage_retries 1)" in proc.stderr
    [line] = errors(proc.stderr)
    assert line.startswith("error: step 2: all 8 episodes failed, nothing to train on (the first: reset_error: "
                           "reset failed: NoDocuments: task ")
    assert "rerun with --resume" in line
    # 2 groups of 2, each sampled once more after failing: 8 episodes, all kept in the rollouts file
    assert len((out / "rollouts" / "step-000002.rank0.jsonl").read_text().splitlines()) == 8
    hotpot_file(data_dir, path, 2)
    proc = sleuth_here("train", *args, "--max-steps", 2, "--resume", capfd=capfd)
    assert proc.returncode == 0 and f"resumed {out} from step 1 (checkpoint step-000001)" in proc.stderr
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2]


# -- checkpoints ------------------------------------------------------------------------------------------
def test_pruning_keeps_the_only_complete_checkpoint_and_loading_falls_back(tiny_model_dir, tmp_path):
    from train_helpers import seeded_engine

    from sleuth.training import checkpoint

    engine = seeded_engine(tiny_model_dir, zero_stage=0, lr=1e-3)
    root = tmp_path / "checkpoints"
    for step in (1, 2):
        checkpoint.save(engine, root, step, {"step": step}, keep=0)
    assert checkpoint.latest(root) == "step-000002" and not list(root.glob(".tmp-*"))
    f = max((root / "step-000002").glob("*.pt"), key=lambda p: p.stat().st_size)
    os.truncate(f, f.stat().st_size // 2)  # a crash cut the newest checkpoint's biggest file
    assert "cut to" in checkpoint.damage(root / "step-000002")
    checkpoint.prune(root, keep=1)
    assert (root / "step-000001").is_dir()  # the only complete checkpoint stays
    restored = checkpoint.load(engine, root)
    assert restored.tag == "step-000001" and restored.state == {"step": 1}
    assert [t for t, _ in restored.skipped] == ["step-000002"]
    (root / "step-000001" / checkpoint.MARKER).unlink()
    with pytest.raises(checkpoint.CheckpointError, match="no complete checkpoint in .*step-000002 has .* cut to"):
        checkpoint.load(engine, root)


SLOW_SEAL = """
import os, runpy, sys, time
from pathlib import Path
from sleuth.training import checkpoint
seal = checkpoint._seal
def slow(tmp, step):  # step 3's files are written; its marker is not: the moment a crash leaves a torn save
    if step == 3:
        Path(os.environ["SEALING"]).touch()
        time.sleep(600)
    seal(tmp, step)
checkpoint._seal = slow
sys.argv = ["sleuth", *sys.argv[1:]]
runpy.run_module("sleuth.cli.main", run_name="__main__")
"""


def test_a_run_killed_mid_checkpoint_resumes_from_the_last_complete_one_and_owns_its_directory(
        tiny_model_dir, tmp_path, capfd):
    """SIGKILL during step 3's checkpoint write (its files written, not sealed), then a file of the newest
    complete checkpoint (step 2) cut in half: `--resume` says so and continues from step 1. While the first
    run lives, the same command run again is refused in one line."""
    out = tmp_path / "run"
    args = ["train", "--out", out, *tiny_args(tiny_model_dir), "--max-steps", 4]
    p = start(args, tmp_path / "killed.log", python=(sys.executable, "-c", SLOW_SEAL),
              SEALING=str(tmp_path / "sealing"))
    wait_for(lambda: (tmp_path / "sealing").exists(), p)
    twin = sleuth_here(*args, capfd=capfd)  # the same command again, while the first one holds --out
    assert twin.returncode == 2  # BadInput: another process owns --out
    [line] = errors(twin.stderr)
    assert f"{out.absolute()} is in use by pid {p.pid}" in line
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    ckpts = out / "checkpoints"
    assert (ckpts / ".tmp-step-000003").is_dir() and not (ckpts / "step-000003").exists()
    assert (ckpts / "latest").read_text() == "step-000002"
    f = ckpts / "step-000002" / "mp_rank_00_model_states.pt"
    os.truncate(f, f.stat().st_size // 2)
    resumed = sleuth_here(*args, "--resume", capfd=capfd)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    errors(resumed.stderr)
    assert ("skipped damaged checkpoint step-000002 (has mp_rank_00_model_states.pt cut to "
            in resumed.stderr) and "falling back to step-000001" in resumed.stderr
    assert f"resumed {out} from step 1 (checkpoint step-000001)" in resumed.stderr
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4]
    assert sorted(p.name for p in ckpts.iterdir() if p.suffix != ".py") == ["latest", "step-000003", "step-000004"]
    for tag in ("step-000003", "step-000004"):
        f = ckpts / tag / "mp_rank_00_model_states.pt"
        os.truncate(f, 100)
    broken = sleuth_here(*args, "--resume", capfd=capfd)
    assert broken.returncode == 1
    [line] = errors(broken.stderr)
    assert line.startswith(f"error: no complete checkpoint in {ckpts}: step-000004 has mp_rank_00_model_states.pt")
    assert "start a new run in another --out" in line


# -- Ctrl-C and resume messages ------------------------------------------------------------------------------
def test_ctrl_c_says_to_resume_and_resume_says_where_it_continues(tiny_model_dir, tmp_path, capfd):
    out = tmp_path / "run"
    args = ["train", "--out", out, *tiny_args(tiny_model_dir), "--max-steps", 3, "--resume"]
    log = tmp_path / "first.log"
    p = start(args, log)
    # `latest` is written last, after the tag directory is renamed into place: a SIGINT between the two leaves a
    # whole checkpoint that resume finds by its tag, but no pointer for this test to read
    wait_for(lambda: (out / "checkpoints" / "latest").exists(), p)
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=120) == 130
    stderr = log.read_text()
    errors(stderr)
    assert f"no checkpoint in {out}: starting from step 0" in stderr  # --resume into a new directory
    assert stderr.rstrip().splitlines()[-1] == "interrupted: rerun with --resume to continue from the last checkpoint"
    step = int((out / "checkpoints" / "latest").read_text().removeprefix("step-"))
    plain = sleuth_here(*args[:-1], capfd=capfd)  # what the message says not to do is refused, in one line
    assert plain.returncode == 2 and "pass --resume" in errors(plain.stderr)[0]
    again = sleuth_here(*args, capfd=capfd)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed {out} from step {step} (checkpoint step-{step:06d})" in again.stderr
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3]


def test_sft_refuses_a_directory_another_process_owns(tiny_model_dir, tmp_path, capfd):
    out = tmp_path / "sft"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from sleuth.core.rundir import RunDirLock; "
                               f"RunDirLock({str(out)!r}).acquire(); print('held', flush=True); time.sleep(120)"],
                              env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        proc = sleuth_here("sft", "--out", out, "--set", f"model={tiny_model_dir}", "--set", "data.task_limit=2",
                           capfd=capfd)
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 2  # BadInput: another process owns --out
    [line] = errors(proc.stderr)
    assert f"{out.absolute()} is in use by pid {holder.pid}" in line and "choose another --out" in line

