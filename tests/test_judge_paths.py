"""A judge everywhere a verifier goes, with a scripted judge served for real: `sleuth eval` (pointwise, and a
group judge over --samples), `sleuth train` (each group in one call, its counts in the metrics; a judge that is
down fails groups, never scores them), TRL's GRPOTrainer through the adapter, and the verl / OpenRLHF adapters
called as those trainers call them."""

import json
import re
import subprocess

import pytest
from judge_server import ScriptedJudge, judge_file
from judge_server import members_shown as members
from procs import sleuth_here

from sleuth.agents.eval.episodes import load_trajectories
from sleuth.core.net import free_port, in_thread


def by_length(messages) -> str:
    """Scores each member by its length (0–9): different responses get different scores."""
    return "\n".join(f"RESPONSE {i + 1} SCORE: {min(9, len(r) // 3)}" for i, r in enumerate(members(messages)))


def by_length_mod(messages) -> str:
    """Scores each member by its length mod 10: long transcripts of different lengths get different scores."""
    return "\n".join(f"RESPONSE {i + 1} SCORE: {len(r) % 10}" for i, r in enumerate(members(messages)))


def right_or_wrong(messages) -> str:
    """A pointwise judge that compares the response with the reference answer in its prompt."""
    text = messages[-1]["content"]
    reference = re.search(r"Reference answer: (.*)\n", text).group(1)
    response = text.split("Response:\n<<<\n", 1)[1].split("\n>>>", 1)[0]
    return f"Compared with the reference.\nSCORE: {10 if reference.lower() in response.lower() else 0}"


def test_sleuth_eval_scores_an_envs_episodes_with_a_judge(serve_judge, tmp_path, capsys):
    judge, url = serve_judge(right_or_wrong)
    name = judge_file(tmp_path, url, weights={"judge": 1, "env": 1})
    out = tmp_path / "run"
    r = sleuth_here("eval", "--env", "DocRead-v0", "--policy", "oracle", "--tasks", "hotpotqa:test", "--limit", "3",
                    "--verifier", name, "--out", str(out), capfd=capsys)
    assert r.returncode == 0, r.stderr[-2000:]
    trajs = load_trajectories(out / "trajectories.jsonl")
    assert len(trajs) == 3 and len(judge.requests) == 3
    for t in trajs:  # the oracle answers right: the judge's 1.0 beside the env's own F1 of 1.0
        assert t.reward == pytest.approx(1.0) and t.verdict.details["terms"] == {"judge": 1.0, "env": 1.0}
        assert t.verdict.details["judge"]["reply"].endswith("SCORE: 10") and t.verdict.details["env"]["f1"] == 1.0
        assert t.verdict.details["f1"] == 1.0  # the env's own details stay, for the reports
    summary = json.loads((out / "summary.json").read_text())
    assert summary["judge"]["judge/calls"] == 3 and summary["judge"]["judge/unavailable"] == 0
    assert json.loads((out / "run.json").read_text())["verifier"] == name  # part of the run's identity


def test_sleuth_eval_with_a_group_judge_compares_a_tasks_samples(serve_judge, tmp_path, capsys):
    judge, url = serve_judge(by_length)
    name = judge_file(tmp_path, url, mode="group", group_reward="rank")
    out = tmp_path / "run"
    r = sleuth_here("eval", "--env", "DocRead-v0", "--policy", "random", "--tasks", "hotpotqa:test", "--limit", "2",
                    "--samples", "3", "--temperature", "0.7", "--verifier", name, "--out", str(out), capfd=capsys)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(judge.requests) == 2 and all(len(members(m)) == 3 for m in judge.requests)
    trajs = load_trajectories(out / "trajectories.jsonl")
    for task in {t.task_id for t in trajs}:
        mine = [t for t in trajs if t.task_id == task]
        assert len(mine) == 3 and sorted(t.verdict.details["judge"]["shown_as"] for t in mine) == [1, 2, 3]
    # a group judge with one sample per task has nothing to compare: one line, before anything runs
    r = sleuth_here("eval", "--env", "DocRead-v0", "--policy", "oracle", "--tasks", "hotpotqa:test", "--limit", "2",
                    "--verifier", name, "--out", str(tmp_path / "one"), capfd=capsys)
    assert r.returncode != 0 and "needs --samples" in r.stderr and "Traceback" not in r.stderr


def test_sleuth_eval_with_a_judge_that_is_down_scores_nothing_and_the_same_command_retries(serve_judge, tmp_path,
                                                                                          capsys):
    port = free_port()
    name = judge_file(tmp_path, f"http://127.0.0.1:{port}", retries=1)
    out = tmp_path / "run"
    cmd = ["eval", "--env", "DocRead-v0", "--policy", "oracle", "--tasks", "hotpotqa:test", "--limit", "2",
           "--verifier", name, "--out", str(out)]
    r = sleuth_here(*cmd, capfd=capsys)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_failed"] == 2 and summary["judge"]["judge/unavailable"] == 2
    assert all(t.failed and t.stop_reason == "verifier_error" for t in load_trajectories(out / "trajectories.jsonl"))
    judge = ScriptedJudge(lambda m: "SCORE: 10")  # the judge comes back on the same port
    import uvicorn

    from sleuth.core.net import wait_healthy

    server = uvicorn.Server(uvicorn.Config(judge.app(), host="127.0.0.1", port=port, log_level="error"))
    import threading

    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_healthy(f"http://127.0.0.1:{port}")
        r = sleuth_here(*cmd, capfd=capsys)
    finally:
        server.should_exit = True
        thread.join(5)
    assert r.returncode == 0, r.stderr[-2000:]
    trajs = load_trajectories(out / "trajectories.jsonl")
    assert len(trajs) == 2 and all(t.reward == 1.0 and not t.failed for t in trajs) and len(judge.requests) == 2


def test_sleuth_train_takes_its_outcome_from_a_group_judge(serve_judge, tiny_model_dir, tmp_path):
    from sleuth.training.config import load_config
    from sleuth.training.rl.trainer import Trainer

    judge, url = serve_judge(by_length_mod)
    # shown the transcripts (the tiny model never answers: its responses are all empty, its actions are not)
    name = judge_file(tmp_path, url, mode="group", group_reward="rank", show="transcript")
    cfg = load_config(overrides={
        "model": tiny_model_dir, "out": str(tmp_path / "run"), "env_args": {"harness": "text"}, "task_limit": 8,
        "rollout.max_tokens": 12, "rollout.tasks_per_step": 2, "rollout.group_size": 3, "rollout.temperature": 1.0,
        "checkpoint.export_hf": False, "tensorboard": False, "max_steps": 1, "verifier": name})
    rows = Trainer(cfg, progress=False).train()
    assert len(judge.requests) == 2 and all(len(members(m)) == 3 for m in judge.requests)  # a call per group
    assert rows[0]["judge/calls"] == 2 and rows[0]["judge/unavailable"] == 0 and rows[0]["judge/prompt_tokens"] > 0
    trajs = load_trajectories(tmp_path / "run" / "rollouts" / "step-000001.rank0.jsonl")
    assert len(trajs) == 6
    for t in trajs:  # the reward trained on is the judge's rank, as written in the rollout
        said = t.verdict.details["judge"]
        assert t.reward == pytest.approx((3 - said["rank"]) / 2)
    assert all("[action 1]" in m for r in judge.requests for m in members(r))
    assert rows[0]["adv/absmax"] > 0


def test_sleuth_train_never_scores_a_group_its_judge_could_not_judge(tiny_model_dir, tmp_path, hotpot_tasks):
    """A judge that is down: each group fails as a verifier error, is counted and sampled again, never trained on."""
    from sleuth.agents.eval.rescore import Rescorer
    from sleuth.agents.trajectory import Trajectory, Turn
    from sleuth.rewards import make
    from sleuth.training.rl.collected import Collected
    from sleuth.verifiers.base import Verdict

    name = judge_file(tmp_path, f"http://127.0.0.1:{free_port()}", mode="group", retries=0)
    tasks = {t.id: t for t in hotpot_tasks[:2]}
    got = Collected(make("grpo"), tasks, keep_no_signal=True, rescore=Rescorer(name, tasks))

    def member(task_id, answer, reward):
        return Trajectory(task_id, "DocRead-v0", [1], turns=[Turn([5], [-0.1], answer, reward=reward)], reward=reward,
                          verdict=Verdict(reward, {}, response=answer), group=f"{task_id}@1.0")

    again = got.take([member(tid, a, r) for tid in tasks for a, r in (("x", 1.0), ("y", 0.0))])
    assert [t.id for t in again] == list(tasks) and got.dropped_failed == 2 and not got.kept
    assert all(t.failed and t.stop_reason == "verifier_error" for t in got.seen)


def test_trl_reward_with_a_group_judge_scores_each_prompts_completions_together(serve_judge, tmp_path):
    from sleuth.verifiers.adapters import trl_reward

    judge, url = serve_judge(by_length)
    reward = trl_reward(judge_file(tmp_path, url, mode="group", group_reward="score", shuffle=False))
    prompts = [[{"role": "user", "content": "Capital of France?"}]] * 2 + [[{"role": "user", "content": "2+2?"}]] * 2
    completions = [[{"role": "assistant", "content": c}] for c in ("Paris", "It is Paris, in France", "4", "four")]
    logged = {}
    scores = reward(prompts=prompts, completions=completions, answer=["Paris", "Paris", "4", "4"],
                    log_metric=lambda k, v: logged.update({k: v}), trainer_state=None)
    assert len(judge.requests) == 2 and [members(m) for m in judge.requests] == [["Paris", "It is Paris, in France"],
                                                                                  ["4", "four"]]
    assert "Question: Capital of France?" in judge.requests[0][-1]["content"]
    assert scores == pytest.approx([0.1, 0.7, 0.0, 0.1]) and list(logged.values()) == [1.0]


def test_trl_grpo_trainer_trains_on_a_group_judge(serve_judge, tiny_model_dir, tmp_path):
    """TRL's own GRPOTrainer calls the judge once per prompt's group and logs its rank rewards. The policy is the
    tiny random model: what is checked is the plumbing (calls, members, the logged mean), which no model's quality
    changes, so the 135M model's generation and update would only add minutes."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from sleuth.verifiers.adapters import trl_reward

    judge, url = serve_judge(by_length)
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": q}], "answer": a}
                            for q, a in (("Which city is the capital of France?", "Paris"),
                                         ("Who wrote Hamlet?", "William Shakespeare"))])
    cfg = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                     max_completion_length=12, max_steps=1, learning_rate=1e-6, bf16=False, use_cpu=True,
                     logging_steps=1, report_to=[], gradient_checkpointing=False, save_strategy="no", seed=0)
    fn = trl_reward(judge_file(tmp_path, url, mode="group", group_reward="rank"), name="judge")
    trainer = GRPOTrainer(model=tiny_model_dir, reward_funcs=[fn], args=cfg, train_dataset=ds)
    trainer.train()
    assert len(judge.requests) == 1 and len(members(judge.requests[0])) == 4  # one prompt's 4 completions, one call
    logged = [h for h in trainer.state.log_history if "rewards/judge/mean" in h]
    assert len(logged) == 1 and logged[0]["rewards/judge/mean"] == pytest.approx(0.5, abs=1e-6)  # ranks average ½


def test_verl_and_openrlhf_adapters_carry_a_pointwise_judge(serve_judge, tmp_path):
    from sleuth.verifiers.adapters.openrlhf import openrlhf_rewards
    from sleuth.verifiers.adapters.verl import compute_score

    judge, url = serve_judge(right_or_wrong)
    name = judge_file(tmp_path, url)
    out = compute_score(data_source="hotpotqa", solution_str="Answer: Paris", ground_truth="Paris",
                        extra_info={"verifier": name, "question": "Capital of France?"})
    assert out["score"] == 1.0 and "Question: Capital of France?" in judge.requests[-1][-1]["content"]
    prompt = "<|im_start|>user\nCapital of France?<|im_end|>\n<|im_start|>assistant\n"
    got = openrlhf_rewards(name, [prompt + "Lyon<|im_end|>", prompt + "Paris<|im_end|>"], [prompt] * 2, ["Paris"] * 2)
    assert got["rewards"] == [0.0, 1.0] and "Capital of France?" in judge.requests[-1][-1]["content"]


def test_judge_check_measures_agreement_and_biases(serve_judge, tmp_path, capsys):
    """A judge that follows the reference exactly agrees perfectly and has no length bias; a group judge that
    always prefers the member shown first has all of the position bias the check can show."""
    _, fair_url = serve_judge(right_or_wrong)
    _, first_url = serve_judge(lambda m: "RESPONSE 1 SCORE: 9\nRESPONSE 2 SCORE: 1")
    out = tmp_path / "check"
    r = sleuth_here("judge-check", "--judge", judge_file(tmp_path, fair_url).removeprefix("judge:"),
                    "--group-judge", judge_file(tmp_path, first_url, mode="group").removeprefix("judge:"),
                    "--tasks", "hotpotqa:dev", "--limit", "6", "--out", str(out), capfd=capsys)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads((out / "judge_check.json").read_text())
    p, g = got["pointwise"], got["group"]
    assert p["unreadable"] == 0 and p["agreement"]["accuracy_vs_em"]["value"] == 1.0
    assert p["agreement"]["auc_vs_em"]["value"] == 1.0 and p["agreement"]["kappa_vs_em"]["value"] == 1.0
    assert p["mean_score"]["gold"]["mean"] == 1.0 and p["mean_score"]["wrong"]["mean"] == 0.0
    assert p["length_bias"]["padded_gold_minus_gold"]["mean"] == 0.0 and p["cost"]["calls"] == p["candidates"]
    assert g["first_shown_wins"]["mean"] == 1.0 and g["same_pick_both_orders"]["mean"] == 0.0
    assert g["gold_preferred"]["mean"] == 0.5 and g["padded_preferred"]["mean"] == 0.0 and g["calls"] == 24
    assert (out / "judge_check.png").stat().st_size > 0 and "| first shown wins | 1.000" in (out / "judge_check.md"
                                                                                           ).read_text()
    # a judge that is down scored nothing: one line, non-zero
    down = judge_file(tmp_path, f"http://127.0.0.1:{free_port()}", retries=0).removeprefix("judge:")
    r = sleuth_here("judge-check", "--judge", down, "--limit", "3", "--out", str(tmp_path / "down"), capfd=capsys)
    assert r.returncode != 0 and "scored nothing" in r.stderr and "Traceback" not in r.stderr
    r = sleuth_here("judge-check", "--out", str(tmp_path / "none"), capfd=capsys)
    assert r.returncode != 0 and "--judge FILE" in r.stderr


def test_the_shipped_judge_files_load():
    from pathlib import Path

    from sleuth.verifiers.judge import JudgeConfig

    files = sorted((Path(__file__).resolve().parents[1] / "configs" / "judges").glob("*.yaml"))
    assert len(files) >= 3
    modes = {JudgeConfig.load(f).mode for f in files}
    assert modes == {"pointwise", "group"}


def _verl_python() -> str | None:
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / ".venv-verl" / "bin" / "python"
    return str(path) if path.exists() else None


@pytest.mark.skipif(_verl_python() is None, reason="no verl interpreter (make verl builds .venv-verl)")
def test_verl_and_openrlhf_themselves_get_a_judges_scores(serve_judge, tmp_path):
    """verl 0.9's own loader and reward manager, and OpenRLHF 0.11's own reward client (over HTTP from `sleuth
    serve verifier` and through the adapter file), score with a pointwise judge, in their venv."""
    import os
    from pathlib import Path

    from sleuth.agents.policies.models import resolve_model
    from sleuth.servers.verifier import create_app

    judge, url = serve_judge(right_or_wrong)
    name = judge_file(tmp_path, url)
    adapters = Path(__file__).resolve().parents[1] / "verifiers" / "adapters"
    rows = [{"prompt": "Capital of France?", "response": f"Answer: {a}", "data_source": "hotpotqa",
             "ground_truth": "Paris", "extra_info": {"verifier": name, "question": "Capital of France?"}}
            for a in ("Paris", "Lyon")]
    spec = tmp_path / "verl.json"
    spec.write_text(json.dumps({"tokenizer": str(resolve_model("smollm2")), "adapter": str(adapters / "verl.py"),
                                "rows": rows}))
    r = subprocess.run([_verl_python(), str(Path(__file__).with_name("verl_worker.py")), str(spec)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [1.0, 0.0]
    assert sum("Question: Capital of France?" in m[-1]["content"] for m in judge.requests) == 2
    prompt = "<|im_start|>user\nCapital of France?<|im_end|>\n<|im_start|>assistant\n"
    qa = {"queries": [prompt + "Paris<|im_end|>", prompt + "Lyon<|im_end|>"], "prompts": [prompt] * 2,
          "labels": ["Paris"] * 2}
    with in_thread(create_app(name)) as server:
        spec = tmp_path / "openrlhf.json"
        spec.write_text(json.dumps({"calls": [{"url": f"{server}/get_reward", **qa},
                                              {"url": str(adapters / "openrlhf.py"), **qa}]}))
        r = subprocess.run([_verl_python(), str(Path(__file__).with_name("openrlhf_worker.py")), str(spec)],
                           capture_output=True, text=True, timeout=300, env={**os.environ, "SLEUTH_VERIFIER": name})
    assert r.returncode == 0, r.stderr[-3000:]
    answers = json.loads(r.stdout.strip().splitlines()[-1])
    assert [[x for part in a for x in part["rewards"]] for a in answers] == [[1.0, 0.0]] * 2
