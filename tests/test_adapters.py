"""Verifiers inside other trainers: TRL (run for real), verl (its own loader and reward manager), OpenRLHF
(its own reward client, over HTTP and the file form), and the verifier server."""

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from sleuth.core.net import in_thread
from sleuth.tasks import load_tasks
from sleuth.verifiers.adapters import compute_score, reward_func, trl_reward
from sleuth.verifiers.qa import QAVerifier
from sleuth.verifiers.registry import score

ADAPTERS = Path(__file__).resolve().parents[1] / "verifiers" / "adapters"


def test_generic_score_and_extraction(data_dir):
    # "city of paris" vs "paris": precision 1/3, recall 1 -> F1 0.5
    assert score("qa", {"answer": "Paris"}, "Let me think.\nAnswer: the city of Paris") == pytest.approx(0.5)
    assert score("qa", {"answer": ["Paris", "City of Paris"]}, "<answer>city of paris</answer>") == 1.0
    rec = json.loads((data_dir / "mbpp" / "mbpp.jsonl").read_text().splitlines()[1])
    assert score("code", rec, f"Here it is:\n```python\n{rec['code']}\n```") == 1.0
    with pytest.raises(ValueError, match="unknown verifier"):
        score("bleu", {}, "")


def test_trl_reward_contract_by_hand():
    f = trl_reward("qa")
    assert f.__name__ == "sleuth_qa"
    logged = {}
    out = f(prompts=["q1", "q2", "q3"], completions=["Answer: Paris", [{"role": "assistant", "content": "Rome"}], "x"],
            completion_ids=[[1], [2], [3]], answer=["Paris", "Rome", None], type=["a", "b", "c"],
            trainer_state=object(), log_extra=lambda *a: None, log_metric=lambda k, v: logged.update({k: v}))
    assert out == [1.0, 1.0, None] and logged == {"sleuth_qa/scored_fraction": pytest.approx(2 / 3)}


@pytest.mark.slow
def test_trl_grpo_trainer_runs_with_our_verifier_as_reward(tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from sleuth.agents.policies.models import embedded_model_dir

    # comparison questions: the answer is a name in the question, so sampled completions often overlap it
    tasks = [t for t in load_tasks("hotpotqa:test", limit=60) if t.payload["type"] == "comparison"
             and t.answer.lower() in t.question.lower()][:2]
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{t.question} Answer with the name only."}],
                             "answer": t.answer} for t in tasks])
    calls = []
    inner = trl_reward("qa")

    def sleuth_qa(prompts, completions, **kw):
        scores = inner(prompts, completions, **kw)
        calls.append((completions, kw["answer"], scores))
        return scores

    cfg = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                     max_completion_length=12, max_steps=1, learning_rate=1e-6, bf16=False, use_cpu=True,
                     logging_steps=1, report_to=[], gradient_checkpointing=False, save_strategy="no", seed=0)
    trainer = GRPOTrainer(model=str(embedded_model_dir()), reward_funcs=[sleuth_qa], args=cfg, train_dataset=ds)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "rewards/sleuth_qa/mean" in h]
    assert len(calls) == 1 and len(logged) == 1
    completions, answers, scores = calls[0]
    direct = [QAVerifier()({"answer": a}, c[0]["content"].strip()).score
              for c, a in zip(completions, answers, strict=True)]
    assert scores == direct and len(scores) == 4
    assert logged[0]["rewards/sleuth_qa/mean"] == pytest.approx(sum(scores) / 4, abs=1e-6)


def _load_like_verl(path: Path, name: str = "compute_score"):
    """What verl's get_custom_reward_fn does: import the file by path, take the named function."""
    spec = importlib.util.spec_from_file_location("custom_module", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def test_verl_compute_score_as_verl_calls_it(data_dir):
    fn = _load_like_verl(ADAPTERS / "verl.py")
    # the naive reward manager: keyword arguments, extra_info with num_turns
    out = fn(data_source="hotpotqa", solution_str="Answer: Denise Levertov", ground_truth="Denise Levertov",
             extra_info={"num_turns": 2, "index": 0})
    assert out["score"] == 1.0 and out["em"] == 1.0
    assert fn("nq_open", "<answer>paris</answer>", ["Paris", "City of Paris"])["score"] == 1.0  # main_eval: positional
    rec = json.loads((data_dir / "mbpp" / "mbpp.jsonl").read_text().splitlines()[1])
    gt = json.dumps({k: rec[k] for k in ("test_list", "test_setup_code")})
    assert fn("mbpp", f"```python\n{rec['code']}\n```", gt)["score"] == 1.0
    assert fn("mbpp", "def nothing(): pass", gt)["score"] == 0.0
    assert compute_score("my_data", "x", "y", extra_info={"verifier": "qa"})["score"] == 0.0


def _verl_python() -> str | None:
    path = Path(__file__).resolve().parents[1] / ".venv-verl" / "bin" / "python"
    return str(path) if path.exists() else None


@pytest.mark.skipif(_verl_python() is None, reason="no verl interpreter (make verl builds .venv-verl)")
def test_verl_itself_loads_and_calls_the_adapter(data_dir, tmp_path):
    """verl 0.9's own loader (`get_custom_reward_fn`) and reward manager (`NaiveRewardManager`, which decodes
    responses from token ids) score QA, code and SWE rows with sleuth's adapter, in verl's own venv."""
    from sleuth.agents.policies.models import resolve_model
    from sleuth.tasks.swe import SHIPPED

    mbpp = json.loads((data_dir / "mbpp" / "mbpp.jsonl").read_text().splitlines()[1])
    swe = json.loads((SHIPPED / "toolz-1.2.0.jsonl").read_text().splitlines()[0])
    rows = [
        {"prompt": "Who wrote Hamlet?", "response": "Answer: William Shakespeare", "data_source": "hotpotqa",
         "ground_truth": "William Shakespeare"},
        {"prompt": "Who wrote Hamlet?", "response": "Answer: Marlowe", "data_source": "hotpotqa",
         "ground_truth": "William Shakespeare"},
        {"prompt": mbpp["text"], "response": f"```python\n{mbpp['code']}\n```", "data_source": "mbpp",
         "ground_truth": json.dumps({k: mbpp[k] for k in ("test_list", "test_setup_code")})},
        {"prompt": "Fix the bug.", "response": f"```diff\n{swe['patch']}```", "data_source": "swe/toolz",
         "ground_truth": json.dumps(swe)},
        {"prompt": "Fix the bug.", "response": "I give up.", "data_source": "swe/toolz",
         "ground_truth": json.dumps(swe)},
    ]
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"tokenizer": str(resolve_model("smollm2")), "adapter": str(ADAPTERS / "verl.py"),
                                "rows": rows}))
    r = subprocess.run([_verl_python(), str(Path(__file__).with_name("verl_worker.py")), str(spec)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [1.0, 0.0, 1.0, 1.0, 0.0]


@pytest.mark.skipif(_verl_python() is None, reason="no OpenRLHF interpreter (make verl builds .venv-verl)")
def test_openrlhf_itself_fetches_rewards(data_dir, tmp_path):
    """OpenRLHF 0.11.2's own reward client (`SingleTurnAgentExecutor`) gets sleuth's verdicts both ways its
    `--reward.remote_url` allows: from `sleuth serve verifier` over HTTP (QA and code servers) and from the
    adapter file (`.py` form, `SLEUTH_VERIFIER`), in OpenRLHF's venv."""
    from sleuth.servers.verifier import create_app

    mbpp = json.loads((data_dir / "mbpp" / "mbpp.jsonl").read_text().splitlines()[1])
    prompt = "<|im_start|>user\nWho wrote Hamlet?<|im_end|>\n<|im_start|>assistant\n"
    qa = {"queries": [prompt + "William Shakespeare<|im_end|>", prompt + "Marlowe<|im_end|>"],
          "prompts": [prompt, prompt], "labels": ["William Shakespeare"] * 2}
    code_label = json.dumps({k: mbpp[k] for k in ("test_list", "test_setup_code")})
    code = {"queries": [prompt + f"```python\n{mbpp['code']}\n```<|im_end|>", prompt + "def f(): pass<|im_end|>"],
            "prompts": [prompt, prompt], "labels": [code_label] * 2}
    with in_thread(create_app("qa")) as qa_url, in_thread(create_app("code")) as code_url:
        spec = tmp_path / "spec.json"
        spec.write_text(json.dumps({"calls": [{"url": f"{qa_url}/get_reward", **qa},
                                              {"url": f"{code_url}/get_reward", **code},
                                              {"url": str(ADAPTERS / "openrlhf.py"), **qa}]}))
        r = subprocess.run([_verl_python(), str(Path(__file__).with_name("openrlhf_worker.py")), str(spec)],
                           capture_output=True, text=True, timeout=300, env={**os.environ, "SLEUTH_VERIFIER": "qa"})
    assert r.returncode == 0, r.stderr[-3000:]
    answers = json.loads(r.stdout.strip().splitlines()[-1])  # per call: one dict per request OpenRLHF made
    assert [len(a) for a in answers] == [1, 1, 2]  # HTTP: a request per server; the file: one per sample
    for key in ("rewards", "scores"):
        assert [[x for part in a for x in part[key]] for a in answers] == [[1.0, 0.0]] * 3
    assert answers[1][0]["extra_logs"] == {"sleuth_code_mean": 0.5}


def test_openrlhf_reward_func_file_form():
    fn = _load_like_verl(ADAPTERS / "openrlhf.py", "reward_func")
    prompts = ["<|im_start|>user\nCapital of France?<|im_end|>\n<|im_start|>assistant\n"] * 2
    queries = [prompts[0] + "Paris<|im_end|>", prompts[1] + "Lyon<|im_end|>"]
    out = fn(queries, prompts, ["Paris", "Paris"])
    assert out["rewards"] == [1.0, 0.0] and out["scores"] == [1.0, 0.0] and "sleuth_qa_mean" in out["extra_logs"]
    with pytest.raises(ValueError, match="start with its prompt"):
        reward_func(["abc"], ["xyz"], ["a"])


@pytest.fixture(scope="module", params=["qa", "code", "swe"])
def verifier_server(request):
    from sleuth.servers.verifier import create_app

    with in_thread(create_app(request.param, workers=2, max_records=8)) as url:
        yield request.param, url


def test_verifier_server_scores_and_rejects_bad_input(verifier_server, data_dir):
    name, url = verifier_server
    assert httpx.get(f"{url}/health").json() == {"status": "ok", "verifier": name, "workers": 2}
    if name == "qa":
        good = [{"answer": "Paris", "response": "paris"}, {"answer": "Paris", "response": "Rome"}]
        unscorable = {"question": "no answer field", "response": "x"}
    elif name == "code":
        rec = json.loads((data_dir / "mbpp" / "mbpp.jsonl").read_text().splitlines()[1])
        good = [{**rec, "response": rec["code"]}, {**rec, "response": "def nope(): pass"}]
        unscorable = {"text": "no tests", "response": "x"}
    else:  # a shipped SWE task: its gold patch, and no change at all
        from sleuth.tasks.swe import SHIPPED

        rec = json.loads((SHIPPED / "toolz-1.2.0.jsonl").read_text().splitlines()[0])
        good = [{**rec, "response": rec["patch"]}, {**rec, "response": ""}]
        unscorable = {"text": "no tests", "response": "x"}
        lite = json.loads((data_dir / "swebench_lite" / "test.jsonl").read_text().splitlines()[0])
        docker = httpx.post(f"{url}/score", json={"records": [{**lite, "response": lite["patch"]}]}, timeout=60)
        assert docker.status_code == 503 and "Docker" in docker.json()["detail"]
    r = httpx.post(f"{url}/score", json={"records": good}, timeout=60)
    assert r.status_code == 200 and [x["score"] for x in r.json()["results"]] == [1.0, 0.0]
    for body in ({"records": []}, {"records": [{"answer": "x"}]}, {"records": "nope"}, {"records": [unscorable]},
                 {"records": [good[0]] * 9}):
        bad = httpx.post(f"{url}/score", json=body, timeout=60)
        assert bad.status_code == 422 and bad.json()["detail"], body
    big = httpx.post(f"{url}/score", content=b"x" * (9 * 1024 * 1024), headers={"content-type": "application/json"})
    assert big.status_code == 413
    assert httpx.get(f"{url}/health").status_code == 200


def test_verifier_server_speaks_openrlhf():
    from sleuth.servers.verifier import create_app

    prompt = "<|im_start|>user\nWho wrote Hamlet?<|im_end|>\n<|im_start|>assistant\n"
    body = {"query": [prompt + "William Shakespeare<|im_end|>"], "prompts": [prompt], "labels": ["William Shakespeare"]}
    with in_thread(create_app("qa")) as url:
        r = httpx.post(f"{url}/get_reward", json=body)
        assert r.status_code == 200 and r.json()["rewards"] == [1.0] and r.json()["scores"] == [1.0]
        bad = httpx.post(f"{url}/get_reward", json={**body, "prompts": ["something else"]})
        assert bad.status_code == 422 and "start with its prompt" in bad.json()["detail"]
