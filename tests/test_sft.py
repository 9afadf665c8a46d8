"""Supervised fine-tuning (`sleuth sft`): the loss sees policy tokens only, training raises a trajectory's
likelihood, rejection sampling keeps exactly the accepted episodes, chat records render token-exactly, and
held-out questions never reach training data."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import sleuth
from sleuth.agents.loop.episodes import run_episodes
from sleuth.agents.policies.load import load_policy
from sleuth.core.errors import ConfigError
from sleuth.tasks import LeakageError, check_texts, held_out_specs, load_tasks
from sleuth.training.rl.losses import token_logprobs
from sleuth.training.sft.data import accepted, replay_chats, score
from sleuth.training.sft.trainer import SFTTrainer, load_sft_config, nll_numerator


def _cfg(model, out, **over):
    base = {"model": model, "out": str(out), "tensorboard": False, "data.task_limit": 4, "batch_size": 2,
            "deepspeed.lr": 1e-3, "checkpoint.export_hf": False}
    base.update(over)
    return load_sft_config(overrides=base)


def test_sft_loss_touches_only_policy_tokens():
    """Changing the logits that predict prompt or env tokens changes neither the loss nor its gradient."""
    torch.manual_seed(0)
    ids = torch.randint(0, 11, (1, 6))
    mask = torch.tensor([[0, 0, 1, 1, 0, 1]], dtype=torch.float32)
    base = torch.randn(1, 6, 11)

    def loss_and_grad(logits):
        logits = logits.clone().requires_grad_()
        num = nll_numerator(token_logprobs(logits, ids, mask)[0], mask)
        num.backward()
        return float(num.detach()), logits.grad

    l1, g1 = loss_and_grad(base)
    changed = base.clone()
    changed[0, 3] += 40 * torch.randn(11)  # predicts id 4: an env token
    changed[0, 0] -= 25  # predicts id 1: prompt
    l2, g2 = loss_and_grad(changed)
    assert l1 == pytest.approx(l2) and torch.allclose(g1[0, [1, 2, 4]], g2[0, [1, 2, 4]])
    assert g2[0, 3].abs().sum() == 0 and g2[0, 0].abs().sum() == 0
    # by hand: −Σ log softmax at the three policy positions
    lsm = torch.log_softmax(base[0], -1)
    assert l1 == pytest.approx(-float(lsm[1, ids[0, 2]] + lsm[2, ids[0, 3]] + lsm[4, ids[0, 5]]), abs=1e-5)


def test_accepted_keeps_exactly_the_episodes_at_or_above_the_threshold():
    from sleuth.agents.trajectory import Trajectory, Turn
    from sleuth.verifiers.base import Verdict

    def t(i, s, error=None, tokens=2):
        return Trajectory(f"t{i}", "env", [1], turns=[Turn([5] * tokens, [0.0] * tokens, "a")] if tokens else [],
                          verdict=Verdict(s), error=error)

    trajs = [t(0, 1.0), t(1, 0.4), t(2, 0.5), t(3, 0.9, error="reset failed"), t(4, 0.7, tokens=0), t(5, 0.5)]
    assert [x.task_id for x in accepted(trajs, 0.5)] == ["t0", "t2", "t5"]


def test_rejection_round_keeps_exactly_the_accepted_episodes(tiny_model_dir, tmp_path, hotpot_tasks):
    """A rejection round sampled with the random reader (a real policy whose F1 varies across tasks): the
    round's data are exactly the sampled episodes scoring ≥ min_score, in order, and so is the file."""
    cfg = _cfg(tiny_model_dir, tmp_path / "rft", **{"data.source": "rejection", "data.samples": 2,
                                                     "data.min_score": 0.1, "data.task_limit": 12})
    trainer = SFTTrainer(cfg, progress=False)
    policy = load_policy("random", tokenizer_model=tiny_model_dir)
    trainer._policy = lambda: policy
    data, metrics = trainer.round_data(0)
    make = lambda: sleuth.make("DocRead-v0", harness="text")  # noqa: E731
    sampled = list(run_episodes(make, [t for t in trainer.tasks for _ in range(2)], policy))
    want = accepted(sampled, 0.1)
    assert 0 < len(want) < len(sampled)  # some accepted, some not: the filter is doing something
    assert sorted((t.task_id, score(t)) for t in data) == sorted((t.task_id, score(t)) for t in want)
    assert metrics["data/sampled"] == 24 and metrics["data/accepted"] == len(want)
    assert all(score(t) >= 0.1 for t in data)
    on_disk = [json.loads(line) for line in (tmp_path / "rft" / "data" / "round-0.jsonl").read_text().splitlines()]
    assert len(on_disk) == len(want)


def test_sft_raises_the_likelihood_of_its_trajectory(tiny_model_dir, tmp_path, hotpot_tasks):
    from train_helpers import surrogate

    make = lambda: sleuth.make("DocRead-v0", harness="text")  # noqa: E731
    [traj] = list(run_episodes(make, [load_tasks("hotpotqa:train", limit=1)[0]],
                               load_policy("oracle", tokenizer_model=tiny_model_dir)))
    path = tmp_path / "one.jsonl"
    path.write_text(traj.to_json() + "\n")
    cfg = _cfg(tiny_model_dir, tmp_path / "one", epochs=4, **{"data.source": "trajectories", "data.path": str(path)})
    trainer = SFTTrainer(cfg, progress=False)
    ones = [np.ones(traj.num_policy_tokens)]
    before = surrogate(trainer.engine.module, [traj], ones)
    rows = trainer.train()
    after = surrogate(trainer.engine.module, [traj], ones)
    assert len(rows) == 4 and after > before + 0.5, (before, after)
    assert rows[-1]["loss/nll"] < rows[0]["loss/nll"]


def test_packed_sft_step_gives_the_padded_loss(tiny_model_dir, tmp_path, hotpot_tasks):
    """Three oracle episodes of different lengths in one micro-batch: packed into one row, the first step's
    NLL is the padded one's."""
    make = lambda: sleuth.make("DocRead-v0", harness="text")  # noqa: E731
    trajs = list(run_episodes(make, load_tasks("hotpotqa:train", limit=3),
                              load_policy("oracle", tokenizer_model=tiny_model_dir)))
    assert len({len(t.token_ids()) for t in trajs}) > 1
    path = tmp_path / "three.jsonl"
    path.write_text("".join(t.to_json() + "\n" for t in trajs))
    nll = {}
    for packing in (False, True):
        cfg = _cfg(tiny_model_dir, tmp_path / str(packing), max_steps=1, batch_size=3, packing=packing,
                   **{"data.source": "trajectories", "data.path": str(path)})
        trainer = SFTTrainer(cfg, progress=False)
        nll[packing] = trainer.train()[0]["loss/nll"]
        assert trainer.forward.uses_packing() == packing
    assert abs(nll[True] - nll[False]) < 1e-5, nll


def test_chat_records_render_exactly_as_the_template(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"},
                {"role": "assistant", "content": "read 3"}, {"role": "tool", "content": "[3] Paris\nParis is..."},
                {"role": "assistant", "content": "answer: Paris"}]
    [traj] = replay_chats([{"id": "c0", "messages": messages}], tokenizer)
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    assert tokenizer.decode(traj.token_ids()) == full.rstrip("\n")  # the final "\n" after <|im_end|> is absent
    policy = [tokenizer.decode([i]) for i, m in zip(traj.token_ids(), traj.loss_mask(), strict=True) if m]
    assert "".join(policy) == "read 3<|im_end|>answer: Paris<|im_end|>"
    with pytest.raises(ValueError, match="c1: needs a prompt message followed by at least one assistant"):
        replay_chats([{"id": "c1", "messages": [{"role": "user", "content": "hi"}]}], tokenizer)


def test_held_out_questions_never_reach_training_data(tiny_model_dir, tmp_path, hotpot_tasks):
    with pytest.raises(LeakageError, match="held-out test split"):
        held_out_specs("hotpotqa:test")
    assert held_out_specs("hotpotqa:train", ["hotpotqa:dev"]) == ["hotpotqa:test", "hotpotqa:dev"]
    test_q = hotpot_tasks[3]
    chat = [("mine-1", f"user: {test_q.question}")]  # a renamed record built on a test question
    with pytest.raises(LeakageError, match="mine-1"):
        check_texts(chat, hotpot_tasks, "chat data")
    check_texts([("ok", "an unrelated question about pottery in the 12th century")], hotpot_tasks, "chat data")
    # an eval trajectory of a test question given to `sleuth sft` as demonstrations
    make = lambda: sleuth.make("DocRead-v0", harness="text")  # noqa: E731
    traj = list(run_episodes(make, [test_q], load_policy("oracle", tokenizer_model=tiny_model_dir)))[0]
    traj.task_id = "renamed"
    path = tmp_path / "leak.jsonl"
    path.write_text(traj.to_json() + "\n")
    trainer = SFTTrainer(_cfg(tiny_model_dir, tmp_path / "leak", **{"data.source": "trajectories",
                                                                    "data.path": str(path)}), progress=False)
    with pytest.raises(ConfigError, match="held-out evaluation questions"):
        trainer.train()
    # RL on the test split, or on tasks that include the run's own eval tasks, is refused before any model loads
    from sleuth.training.config import load_config
    from sleuth.training.rl.trainer import Trainer

    with pytest.raises(ConfigError, match="held-out test split"):
        Trainer(load_config(overrides={"model": tiny_model_dir, "tasks": "hotpotqa:test", "out": str(tmp_path / "r")}))
    with pytest.raises(ConfigError, match="held-out evaluation tasks"):
        Trainer(load_config(overrides={"model": tiny_model_dir, "tasks": "hotpotqa:dev", "eval.tasks": "hotpotqa:dev",
                                       "out": str(tmp_path / "r2")}))


def test_sft_cli_oracle_warm_start_exports_and_resumes(tiny_model_dir, tmp_path):
    from sleuth.training.zero import DIST_VARS

    # the test process's own group is taken; one thread, as the suite's other subprocess runs
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS} | {"OMP_NUM_THREADS": "1"}
    out = tmp_path / "sft"
    args = [sys.executable, "-m", "sleuth.cli", "sft", "--out", str(out), "--set", f"model={tiny_model_dir}",
            "--set", "data.task_limit=4", "--set", "batch_size=2", "--set", "tensorboard=false"]
    proc = subprocess.run([*args, "--resume"], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"no checkpoint in {out}: starting from step 0" in proc.stderr  # --resume into a new directory says so
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and rows[0]["data/accept_rate"] == 1.0  # the oracle scores 1
    assert (out / "training.png").exists() and len((out / "data" / "round-0.jsonl").read_text().splitlines()) == 4
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(out / "hf") is not None
    again = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
    assert again.returncode != 0 and "already holds a run" in again.stderr
    more = subprocess.run([*args, "--resume", "--set", "epochs=2"], capture_output=True, text=True, timeout=600,
                          env=env)
    assert more.returncode == 0, more.stderr[-2000:]
    assert f"resumed {out} from step 2 (checkpoint step-000002)" in more.stderr
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]


@pytest.mark.parametrize("over, message", [
    ({"data.source": "demos"}, "data.source must be one of"),
    ({"data.source": "chat"}, "reads data.path"),
    ({"data.rounds": 2}, "only source rejection has rounds"),
    ({"batch_size": 0}, "must be ≥ 1"),
    ({"data.temperature": 0}, "temperature must be > 0"),
])
def test_bad_sft_configs_are_named(over, message):
    with pytest.raises(ConfigError, match=message):
        load_sft_config(overrides=over)


def test_the_demonstrator_is_any_registered_scripted_policy():
    """The names come from the scripted-policy registry: a typo gets "did you mean", a plugin's policy is taken."""
    from sleuth.agents.policies.load import SCRIPTED_POLICIES

    with pytest.raises(ConfigError, match="did you mean 'oracle-title'"):
        load_sft_config(overrides={"data.demonstrator": "oracle-titel"})
    SCRIPTED_POLICIES.register("test-demonstrator", "sleuth.agents.policies.scripted:Oracle")
    try:
        assert load_sft_config(overrides={"data.demonstrator": "test-demonstrator"}).data.demonstrator == \
            "test-demonstrator"
    finally:
        SCRIPTED_POLICIES.unregister("test-demonstrator")
