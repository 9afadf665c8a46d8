"""Branches (`branches.answer`): an episode continued from one of its recorded turns — the env replayed and
checked, the context the recorded ids, the new turns the only ones that train — and how a step counts them."""

import gymnasium
import numpy as np
import pytest

import sleuth
from sleuth.agents.loop.episodes import run_episodes
from sleuth.agents.loop.scheduler import Branch
from sleuth.agents.policies.load import load_policy
from sleuth.envs.outcome import step_info


def _docread():
    return sleuth.make("DocRead-v0", harness="text")


@pytest.fixture(scope="module")
def recorded(hotpot_tasks):
    return {t.task_id: t for t in run_episodes(_docread, hotpot_tasks[:3], load_policy("oracle"))}


def test_a_branch_continues_the_recorded_episode_from_its_turn(hotpot_tasks, recorded):
    """The oracle reads every gold document, then answers: branched before its answer it answers again (it is
    asked for turn `at`, not turn 0), its prompt is the recorded context, and only the answer trains."""
    tasks = {t.id: t for t in hotpot_tasks[:3]}
    points = [Branch(t, tasks[t.task_id], len(t.turns) - 1, group=f"{t.task_id}^0") for t in recorded.values()]
    points.append(Branch(recorded[hotpot_tasks[0].id], hotpot_tasks[0], 1, group="early"))
    out = {t.group: t for t in run_episodes(_docread, points, load_policy("oracle"))}
    for b in points[:3]:
        got, of = out[b.group], b.of
        prefix = of.prompt_ids + [i for t in of.turns[:-1] for i in (*t.action_ids, *t.observation_ids)]
        assert got.prompt_ids == prefix and got.branch_at == len(of.turns) - 1 and not got.failed
        assert [t.action_text for t in got.turns] == [of.turns[-1].action_text]
        assert got.reward == of.reward == 1.0 and got.stop_reason == "final"
        assert got.token_ids() == of.token_ids()
        assert sum(got.loss_mask()) == len(of.turns[-1].action_ids)
    early, of = out["early"], recorded[hotpot_tasks[0].id]
    assert early.branch_at == 1 and [t.action_text for t in early.turns] == [t.action_text for t in of.turns[1:]]
    assert early.token_ids() == of.token_ids() and early.reward == 1.0


class Drifting(gymnasium.Wrapper):
    """DocRead whose replies carry how many times it was reset: the same actions get other replies."""

    resets = 0

    def __init__(self):
        super().__init__(_docread())

    def reset(self, **kw):
        Drifting.resets += 1
        return self.env.reset(**kw)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        out = step_info(info)
        out.messages = [{**m, "content": f"{m['content']} ({Drifting.resets})"} for m in out.messages]
        return obs, reward, terminated, truncated, info


def test_a_branch_of_an_env_that_replies_otherwise_fails_and_is_never_scored(hotpot_tasks):
    of = next(run_episodes(Drifting, hotpot_tasks[:1], load_policy("oracle")))
    assert len(of.turns) > 1 and of.reward == 1.0
    [got] = run_episodes(Drifting, [Branch(of, hotpot_tasks[0], len(of.turns) - 1, group="g")], load_policy("oracle"))
    assert got.failed and got.stop_reason == "replay_error" and "not deterministic" in got.error
    assert got.group == "g" and got.branch_at == len(of.turns) - 1 and not got.turns and got.verdict is None


def test_a_branch_point_lies_between_two_recorded_turns(hotpot_tasks, recorded):
    of = recorded[hotpot_tasks[0].id]
    for at in (0, len(of.turns), len(of.turns) + 1):  # after the last turn there is nothing to sample again
        with pytest.raises(ValueError, match="branch point"):
            Branch(of, hotpot_tasks[0], at)


def test_branch_groups_train_and_are_counted_apart_and_a_failed_one_is_not_sampled_again(hotpot_tasks):
    """One group of episodes that all scored 0 (zero variance, no signal under grpo), one branch group that
    did not tie, and one branch group with a failed member: only the episodes' group counts as zero-variance,
    the intact branch group trains, and no task comes back to be sampled again."""
    import sleuth.rewards  # noqa: F401
    from sleuth.agents.trajectory import Trajectory, Turn
    from sleuth.rewards.base import make
    from sleuth.training.rl.collected import Collected

    task = hotpot_tasks[0]

    def traj(group: str, reward: float, branch_at: int = 0, error: str | None = None) -> Trajectory:
        return Trajectory(task.id, "DocRead-v0", [1, 2], [Turn([3, 4], [-0.1, -0.2], "answer x")], reward=reward,
                          group=group, branch_at=branch_at, error=error, terminated=error is None)

    got = Collected(make("grpo"), {task.id: task}, keep_no_signal=False)
    episodes = [traj("e", 0.0) for _ in range(2)]
    branches = [traj("e^0", 1.0, 1), traj("e^0", 0.0, 1), traj("e^1", 1.0, 1), traj("e^1", 0.0, 1, "replay failed")]
    assert got.take(episodes) == [] and got.take(branches) == []
    assert got.zero_var == {"wrong": 1} and got.no_signal_groups == 1
    assert got.branches.groups == 1 and got.branches.no_signal == 0 and got.dropped_failed == 1
    assert sorted(got.branches.rewards) == [0.0, 1.0, 1.0] and got.branches.failed == 1 and got.demos.groups == 0
    assert got.kept == branches[:2]
    assert [float(a[0]) for a in got.advantages] == pytest.approx([1 / np.sqrt(2), -1 / np.sqrt(2)], rel=1e-5)
    # branches of a demonstrator's episodes: judged alike, counted in their own kind; a tied group has no signal
    demos = [traj("d^demo", 0.5, 2), traj("d^demo", 0.0, 2), traj("f^demo", 1.0, 2), traj("f^demo", 1.0, 2)]
    assert got.take(demos, demos=True) == []
    assert (got.demos.groups, got.demos.no_signal, got.demos.rewards) == (2, 1, [0.5, 0.0, 1.0, 1.0])
    assert got.branches.groups == 1 and got.zero_var == {"wrong": 1} and got.no_signal_groups == 1
    assert got.kept == branches[:2] + demos[:2]
    # grpo over the demo group's rewards 0.5, 0.0: (r − mean) / std, the sample std 0.25·√2 → ±1/√2
    assert [float(a[0]) for a in got.advantages[2:]] == pytest.approx([1 / np.sqrt(2), -1 / np.sqrt(2)], rel=1e-5)


def test_the_step_row_reports_branches_beside_the_episodes():
    from sleuth.training.rl.step_metrics import BranchCount, StepPart, step_row
    from sleuth.training.rl.update import UpdateStats

    part = StepPart(update=UpdateStats(grad_norm=1.0, optimizer_steps=1, train_tokens=10), rewards=[0.0, 1.0],
                    truncated=[0.0, 0.0], success=[0.0, 1.0], length_correct=[5], length_wrong=[5], components={},
                    adv=[0.5], groups=1, zero_var={}, no_signal_groups=0, gen_tokens=20, failed=0, dropped_failed=1,
                    reissued=0, stream=None, branches=BranchCount([1.0, 0.0, 0.5], groups=2, no_signal=1, failed=1))
    row = step_row([part], {"rollout": 1.0, "update": 1.0}, {}, False, 1, 2)
    assert row["episodes/sampled"] == 2 and row["reward/mean"] == 0.5
    assert row["branches/sampled"] == 4 and row["branches/reward/mean"] == 0.5 and row["branches/no_signal"] == 0.5
    assert not any(k.startswith("demos/") for k in row)  # a run without demonstration starts shows none
    part.demos = BranchCount([0.25, 0.75], groups=1)
    row = step_row([part, part], {"rollout": 1.0, "update": 1.0}, {}, False, 1, 2)
    assert row["demos/sampled"] == 4 and row["demos/reward/mean"] == 0.5 and row["demos/no_signal"] == 0.0


def test_branches_are_refused_where_there_is_nothing_to_replay_or_no_step_to_wait_for():
    from sleuth.training.config import AgentConfig, BranchesConfig, RolloutConfig, TrainConfig

    with pytest.raises(ValueError, match="no env to replay"):
        TrainConfig(agent=AgentConfig(entrypoint="m:f"), branches=BranchesConfig(answer=2))
    with pytest.raises(ValueError, match="stream"):
        TrainConfig(rollout=RolloutConfig(max_staleness=1), branches=BranchesConfig(answer=2))
    with pytest.raises(ValueError, match="branches.answer must be"):
        BranchesConfig(answer=-1)
    with pytest.raises(ValueError, match="no env to replay: set branches.demo: 0"):
        TrainConfig(agent=AgentConfig(entrypoint="m:f"), branches=BranchesConfig(demo=2))
    with pytest.raises(ValueError, match="stream"):
        TrainConfig(rollout=RolloutConfig(max_staleness=1), branches=BranchesConfig(demo=2))
    with pytest.raises(ValueError, match="branches.demo must be"):
        BranchesConfig(demo=-1)
    with pytest.raises(ValueError, match="branches.demo is 0"):
        BranchesConfig(demo_tasks=4)


def test_an_episodes_branches_meet_it_in_one_micro_batch_and_add_only_their_own_tokens():
    """Two episodes of one group (a 20-token prompt, then 30 and 25 tokens each) and three branches of the
    first from its context before its last turn (prompt + 24 of its tokens, then 4–6 of their own): one packed
    micro-batch of 20 + 30 + 25 + 15 tokens, not 3 × 44 more."""
    from sleuth.agents.trajectory import Trajectory, Turn
    from sleuth.training.rl.batch import micro_batches
    from sleuth.training.rl.packing import layout

    rng = np.random.default_rng(0)
    prompt = rng.integers(10, 1000, 20).tolist()

    def turn(n: int) -> Turn:
        return Turn(rng.integers(10, 1000, n).tolist(), [-0.5] * n, "x")

    first = Trajectory("t", "e", prompt, [turn(24), turn(6)], group="g")
    second = Trajectory("t", "e", prompt, [turn(25)], group="g")
    context = first.token_ids()[:44]
    branches = [Trajectory("t", "e", context, [turn(n)], group="g^0", branch_at=1) for n in (4, 5, 6)]
    trajs = [branches[0], first, second, *branches[1:]]
    advs = [np.ones(t.num_policy_tokens) for t in trajs]
    [batch] = micro_batches(trajs, advs, 0, 2048, packed=True, share=True)
    row = layout([trajs[i].token_ids() for i in batch.index])
    assert sorted(batch.index) == list(range(5)) and row.tokens == 20 + 30 + 25 + 15


def test_branch_points_are_the_last_turns_of_episodes_that_ended_on_their_own(hotpot_tasks, recorded):
    from dataclasses import replace

    from sleuth.training.rl.branching import branch_points

    task = hotpot_tasks[0]
    done = recorded[task.id]
    one_turn = replace(done, turns=done.turns[-1:])
    cut = replace(done, terminated=False, truncated=True, stop_reason="budget")
    failed = replace(done, error="engine failed", stop_reason="engine_error")
    points = branch_points([one_turn, done, cut, failed, done], {task.id: task})
    assert [(p.at, p.group) for p in points] == [(len(done.turns) - 1, f"{done.group}^1"),
                                                  (len(done.turns) - 1, f"{done.group}^4")]


def test_demo_branches_answer_from_where_the_demonstrator_read_and_train_only_their_answer(tiny_model_dir, tmp_path,
                                                                                          hotpot_tasks):
    """`branches.demo: 3` with `oracle-title`: each task of the step gets a group of 3 continuations from
    the demonstration's context before its answer (its reads done), the demonstration's tokens never train, and
    the step counts them apart from its episodes; with `demo_tasks` the demonstrations play tasks of their own."""
    import json

    from sleuth.agents.policies.base import SamplingParams
    from sleuth.agents.trajectory import Trajectory
    from sleuth.training.config import load_config
    from sleuth.training.rl.trainer import Trainer

    cfg_over = {
        "model": tiny_model_dir, "out": str(tmp_path / "run"), "env_args": {"harness": "text"}, "task_limit": 24,
        "rollout.max_tokens": 12, "rollout.tasks_per_step": 2, "rollout.group_size": 2, "rollout.temperature": 0.7,
        "branches.demo": 3, "branches.demonstrator": "oracle-title", "checkpoint.export_hf": False,
        "tensorboard": False, "max_steps": 1}
    trainer = Trainer(load_config(overrides=cfg_over), progress=False)
    row = trainer.train()[0]
    assert row["episodes/sampled"] == 4 and row["demos/sampled"] == 6 and "branches/sampled" not in row
    trajs = [json.loads(line) for line in (tmp_path / "run/rollouts/step-000001.rank0.jsonl").read_text().splitlines()]
    demos = [Trajectory.from_dict(t) for t in trajs if t["group"].endswith("^demo")]
    assert len(demos) == 6 and len({t.group for t in demos}) == 2 and len(trajs) == 10
    tasks = {t.id: t for t in trainer.tasks}
    shown = {t.task_id: t for t in run_episodes(_docread, [tasks[d.task_id] for d in demos[::3]],
                                               load_policy("oracle-title", tiny_model_dir),
                                               SamplingParams(temperature=0.0))}
    for d in demos:
        of = shown[d.task_id]
        assert len(of.turns) > 1 and d.branch_at == len(of.turns) - 1
        context = of.prompt_ids + [i for t in of.turns[:-1] for i in (*t.action_ids, *t.observation_ids)]
        assert d.prompt_ids == context  # the demonstrator's reads are the context ...
        assert sum(d.loss_mask()) == sum(len(t.action_ids) for t in d.turns)  # ... and only the policy's turns train
        assert not d.failed
    # `demo_tasks: 4`: the demonstrations play 4 tasks drawn after the round's 2, not the round's own
    more = Trainer(load_config(overrides={**cfg_over, "out": str(tmp_path / "more"), "branches.demo_tasks": 4}),
                   progress=False)
    got = more.collect(1)
    episode_tasks = {t.task_id for t in got.seen if not t.branch_at}
    demo_tasks = {t.task_id for t in got.seen if t.branch_at}
    assert got.demos.groups == 4 and len(demo_tasks) == 4 and not episode_tasks & demo_tasks
    assert more.sampler.cursor == 6


def test_a_demonstrator_that_is_not_one_or_ends_no_episode_after_a_read_is_refused(tiny_model_dir, tmp_path):
    from sleuth.core.errors import ConfigError
    from sleuth.training.config import load_config
    from sleuth.training.rl.trainer import Trainer

    def cfg(demonstrator: str, out: str):
        return load_config(overrides={
            "model": tiny_model_dir, "out": str(tmp_path / out), "env_args": {"harness": "text"}, "task_limit": 4,
            "rollout.max_tokens": 8, "rollout.group_size": 2, "branches.demo": 2,
            "branches.demonstrator": demonstrator, "checkpoint.export_hf": False, "tensorboard": False})

    with pytest.raises(ConfigError, match="branches.demonstrator: .*did you mean 'oracle-title'"):
        Trainer(cfg("oracle-titel", "typo"), progress=False)
    noop = Trainer(cfg("noop", "noop"), progress=False)  # it answers at once: no state before its last turn
    with pytest.raises(ConfigError, match="'noop' ended no episode of DocRead-v0 after two or more turns"):
        noop.collect(1)


def test_demonstration_starts_skip_episodes_an_infrastructure_failure_took(hotpot_tasks):
    """An env that cannot reset fails the demonstrator's episodes: no start and no config error (a failure of
    the machine is not the demonstrator's), where a demonstrator that answers at once is refused."""
    from sleuth.core.errors import ConfigError
    from sleuth.training.config import RolloutConfig
    from sleuth.training.rl.branching import demo_points

    class Broken(gymnasium.Wrapper):
        def reset(self, **kw):
            raise ConnectionError("env server went away")

    oracle = load_policy("oracle-title")
    rc = RolloutConfig()
    assert demo_points(lambda: Broken(_docread()), hotpot_tasks[:2], oracle, "oracle-title", rc, "DocRead-v0",
                       "1.0") == []
    points = demo_points(_docread, hotpot_tasks[:2], oracle, "oracle-title", rc, "DocRead-v0", "1.0")
    assert sorted(p.group for p in points) == sorted(f"{t.id}@1.0^demo" for t in hotpot_tasks[:2])  # completion order
    with pytest.raises(ConfigError, match="ended no episode"):
        demo_points(_docread, hotpot_tasks[:2], load_policy("noop"), "noop", rc, "DocRead-v0", "1.0")
