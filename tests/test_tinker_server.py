"""`sleuth serve tinker` driven by the Tinker SDK itself (tinker 0.38.0, in its own venv: `make tinker`) and by
tinker-cookbook's recipes, unchanged: every number the client sees is checked against transformers, against
sleuth's losses recomputed from the served logprobs, or against the trainer's own weights."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import alive, descendants

from sleuth.core.net import free_port, wait_healthy
from sleuth.training.rollout.vllm_servers import default_vllm_python

ROOT = Path(__file__).resolve().parents[1]
TINKER_PY = ROOT / ".venv-tinker" / "bin" / "python"
NAME = "local/tiny"
pytestmark = pytest.mark.skipif(not TINKER_PY.exists(), reason="no tinker venv (make tinker builds .venv-tinker)")


class Server:
    def __init__(self, model_dir: str, state_dir: Path, sampler: str = "transformers", *flags: str):
        self.model_dir, self.state_dir, self.sampler, self.flags = model_dir, state_dir, sampler, flags
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "sleuth.cli", "serve", "tinker", "--model", self.model_dir,
                                      "--name", NAME, "--port", str(port), "--state-dir", str(self.state_dir),
                                      "--sampler", self.sampler, *self.flags],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_healthy(self.url, 600, self.proc)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


@pytest.fixture(scope="module")
def _shared(tiny_model_dir, tmp_path_factory):
    s = Server(tiny_model_dir, tmp_path_factory.mktemp("tinker-state"))
    s.start()
    yield s
    s.kill()


@pytest.fixture
def server(_shared):
    """The module's server (one start for its tests); one that an earlier test killed or crashed is started again
    on its state directory, so that fault stays in its test."""
    if _shared.proc.poll() is not None:
        _shared.start()
    return _shared


def client(server: Server, scenarios: str, *args: str) -> dict:
    """Scenarios of tests/tinker_client.py ("a,b": in order, in one process), run by the SDK's interpreter (-P: the
    repository root, whose folders share names with PyPI packages, stays off sys.path): scenario → its results."""
    out = subprocess.run([str(TINKER_PY), "-P", "-W", "ignore", str(ROOT / "tests" / "tinker_client.py"), scenarios,
                          server.url, NAME, server.model_dir, *args], capture_output=True, text=True, timeout=600,
                         cwd=ROOT / "tests")
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def ran(results: dict, scenario: str) -> dict:
    """One scenario's results; a scenario that raised fails the test that reads it, with its traceback."""
    assert "failed" not in results[scenario], results[scenario]["failed"][-3000:]
    return results[scenario]


@pytest.fixture(scope="module")
def sdk(_shared) -> dict:
    """The SDK scenarios of the tests on the fresh shared server, in one client process (an interpreter that imports
    torch, transformers and the SDK starts once, not once per test). `old_sdk` runs last: it rewrites the SDK's
    version in that process."""
    return client(_shared, "train,losses,errors,old_sdk")


def close(a, b, tol):
    return len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b, strict=True))


def test_training_and_sampling_through_the_sdk(sdk):
    r = ran(sdk, "train")
    # the served logprobs are transformers' own for the same ids (position i scores target i)
    assert close(r["forward"], r["local"], 1e-4)
    assert r["forward_loss"] == pytest.approx(-sum(r["local"]), rel=1e-5)
    assert min(r["losses"][1:]) < r["losses"][0]  # cross-entropy on one datum falls under Adam steps
    assert close(r["other"], r["forward"], 1e-5)  # another client on the same base model: untouched by that training
    # the sampler's weights are the trainer's: compute_logprobs of the saved sampler equals the trainer's forward
    assert r["sampler_logprobs"][0] is None and close(r["sampler_logprobs"][1:], r["trained"], 1e-5)
    assert close(r["base_logprobs"][1:], r["forward"], 1e-5)  # a base-model sampler: LoRA off
    for (tokens, logprobs, reason), rescored in zip(r["samples"], r["rescored"], strict=True):
        assert reason == "length" and len(tokens) == len(logprobs) == 6
        assert close(logprobs, rescored, 1e-4)  # each sampled token's logprob, as the model scores it (T = 1)
    assert r["resampled"] == [s[0] for s in r["samples"]]  # the same seed samples the same tokens
    stop = r["greedy"][2]
    assert r["stopped"] == [[r["greedy"][:r["greedy"].index(stop) + 1], "stop"]] * 2
    assert r["prompt_logprobs"][0] is None and r["topk"][0] is None
    for lp, top in zip(r["prompt_logprobs"][1:], r["topk"][1:], strict=True):
        assert len(top) == 3 and top[0][1] >= top[1][1] >= top[2][1] and top[0][1] >= lp - 1e-5


@pytest.mark.long
@pytest.mark.skipif(default_vllm_python() is None, reason="no vLLM interpreter (make vllm builds .venv-vllm)")
def test_the_vllm_sampler_serves_the_trainers_weights(tiny_model_dir, tmp_path, monkeypatch):
    """`--sampler vllm`: each sampler's weights are synced into vLLM and verified before it samples; an lm_head
    adapter on a tied-embedding model is refused at creation (vLLM loads that matrix once for both ends). The engine
    is eager, as every vLLM engine in the suite (a compiled one costs ~7 CPU s more to start here; a compiled
    engine's synced weights are checked by `experiments/gpu_check.py`'s ray_vllm, which runs vLLM's defaults), and
    its core runs in the vLLM server's process (~9 CPU s fewer: one vLLM import, not two); that a separate engine
    core goes with its server is tests/test_ray_vllm.py's."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    s = Server(tiny_model_dir, tmp_path / "state", "vllm", "--vllm-arg=--enforce-eager")
    s.start()
    try:
        both = client(s, "train,errors", "vllm")
    finally:
        engine = descendants(s.proc.pid, "vllm") + descendants(s.proc.pid, "VLLM::")
        flags = [open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0") for pid in engine if alive(pid)]
        s.kill()
    assert [f for f in flags if b"--enforce-eager" in f]  # --vllm-arg reached the vLLM server
    # a killed server takes its vLLM server (and that one its engine core) with it: nothing holds the memory
    deadline = time.monotonic() + 60
    while any(alive(pid) for pid in engine) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert engine and not [pid for pid in engine if alive(pid)]
    r, refused = ran(both, "train"), ran(both, "errors")["tied_unembed"]
    assert close(r["forward"], r["local"], 1e-4)
    assert r["sampler_logprobs"][0] is None and close(r["sampler_logprobs"][1:], r["trained"], 1e-3)
    assert close(r["base_logprobs"][1:], r["forward"], 1e-3)
    for (tokens, logprobs, _), rescored in zip(r["samples"], r["rescored"], strict=True):
        assert len(tokens) == len(logprobs) == 6 and close(logprobs, rescored, 1e-3)
    stop = r["greedy"][2]
    assert r["stopped"] == [[r["greedy"][:r["greedy"].index(stop) + 1], "stop"]] * 2
    assert r["topk"][0] is None and all(len(top) == 3 for top in r["topk"][1:])
    assert "pass train_unembed=False, or serve with --sampler transformers" in refused


def test_each_rl_loss_is_tinkers_formula_over_the_served_logprobs(sdk):
    r = ran(sdk, "losses")
    q, adv = r["q"], r["adv"]

    def ratio_terms(lp, lo, hi, kind):
        total = 0.0
        for p, s, a in zip(lp, q, adv, strict=True):
            ratio = math.exp(p - s)
            clipped = min(max(ratio, lo), hi)
            total += {"is": -ratio * a, "ppo": -min(ratio * a, clipped * a), "cispo": -clipped * a * p}[kind]
        return total

    assert r["importance_sampling"]["loss"] == pytest.approx(ratio_terms(r["importance_sampling"]["lp"], 0, 1e9,
                                                                         "is"), rel=1e-4)
    assert r["ppo"]["loss"] == pytest.approx(ratio_terms(r["ppo"]["lp"], 0.8, 1.2, "ppo"), rel=1e-4)
    assert r["cispo"]["loss"] == pytest.approx(ratio_terms(r["cispo"]["lp"], 0.8, 1.2, "cispo"), rel=1e-4)
    custom = r["ppo{'clip_low_threshold': 0.5, 'clip_high_threshold': 1.1}"]
    assert custom["loss"] == pytest.approx(ratio_terms(custom["lp"], 0.5, 1.1, "ppo"), rel=1e-4)
    # forward_backward_custom: the SDK computes Σ lp² from a forward here and trains on its gradient (weights
    # −2·lp through cross_entropy): the surrogate it reports is Σ 2·lp², and the user's own metric comes back
    assert r["custom"]["loss:sum"] == pytest.approx(sum(p * p for p in r["ppo"]["lp"]), rel=1e-4)
    assert r["custom"]["surrogate_loss:sum"] == pytest.approx(2 * r["custom"]["loss:sum"], rel=1e-4)
    assert r["custom"]["sq"] == 1.0


def test_bad_input_gets_one_error_naming_what_to_change(sdk):
    r = ran(sdk, "errors")
    assert "loss_fn 'dro' is not served here; use one of cross_entropy" in r["unknown_loss"]
    assert "loss_fn_inputs['weights'] has shape [3] but model_input has" in r["length_mismatch"]
    assert "nothing was saved at tinker://nobody:train:0/sampler_weights/none" in r["never_saved"]
    assert f"this server serves '{NAME}'" in r["other_model"]
    assert r["tied_unembed"] is None  # the transformers sampler serves an lm_head adapter
    old = ran(sdk, "old_sdk")["error"]
    assert old.startswith("BadRequestError: Error code: 400") and "pip install tinker==0.38.0" in old


def test_a_killed_server_resumes_from_the_last_save_state(server):
    """The shared server, killed after a save and started again on its state directory (as the next test finds
    it): the saved adapter loads into a new client of the new process."""
    saved = ran(client(server, "save"), "save")
    pid = server.proc.pid
    server.kill()
    server.start()  # a new process on the same state directory
    resumed = ran(client(server, "resume", saved["path"]), "resume")
    assert server.proc.pid != pid and resumed["lp"] == saved["lp"]


@pytest.mark.parametrize("recipe, config", [
    ("sl_loop", {"batch_size": 4, "max_steps": 3, "max_length": 64, "save_every": 2}),
    ("rl_loop", {"batch_size": 2, "group_size": 4, "max_steps": 2, "max_tokens": 8, "save_every": 0}),
    ("on_policy_distillation", {"teacher_model": NAME, "group_size": 2, "groups_per_batch": 2, "max_tokens": 8,
                                "max_steps": 2, "lora_rank": 4, "save_every": 0, "eval_every": 0}),
])
def test_tinker_cookbook_recipes_run_unchanged(server, recipe, config, tmp_path):
    config = {**config, "log_path": str(tmp_path / recipe)}
    env = {**os.environ, "SLEUTH_DATA": os.environ.get("SLEUTH_DATA", str(ROOT.parent / "shared" / "data"))}
    out = subprocess.run([str(TINKER_PY), "-P", "-W", "ignore", str(ROOT / "examples" / "tinker_cookbook" /
                          "run_recipe.py"), recipe, "--base-url", server.url, "--model-dir", server.model_dir,
                          "--model-name", NAME, "--config", json.dumps(config)], capture_output=True, text=True,
                         timeout=900, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / recipe / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == config["max_steps"]
    if recipe == "sl_loop":
        assert all(math.isfinite(row["train_mean_nll"]) and row["train_mean_nll"] > 0 for row in rows)
    elif recipe == "rl_loop":
        assert all(0 <= row["reward/total"] <= 1 for row in rows)
    else:  # the teacher is the student's own base model: the recipe's KL to it starts at 0, and its check that the
        # sampler's logprobs are the trainer's (kl_sample_train) holds on every step
        assert abs(rows[0]["teacher_kl"]) < 1e-4
        assert all(abs(row["optim/kl_sample_train_v1"]) < 1e-3 for row in rows)
    final = [json.loads(line) for line in (tmp_path / recipe / "checkpoints.jsonl").read_text().splitlines()][-1]
    assert final["name"] == "final" and final["state_path"].startswith("tinker://")
