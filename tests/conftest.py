import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # shared helpers (train_helpers) under importlib mode


def _data() -> Path:
    for cand in (REPO.parent / "shared" / "data", REPO / "shared" / "data"):
        if cand.is_dir():
            return cand
    raise RuntimeError("tests need ../shared/data")


if "SLEUTH_DATA" not in os.environ:  # an explicit $SLEUTH_DATA wins (a checkout that is not next to shared/)
    os.environ["SLEUTH_DATA"] = str(_data())


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return Path(os.environ["SLEUTH_DATA"])


@pytest.fixture(scope="session")
def hotpot_tasks():
    from sleuth.tasks import load_tasks

    return load_tasks("hotpotqa:test", limit=20)


@pytest.fixture(scope="session")
def tokenizer():
    from sleuth.agents.policies.load import load_tokenizer

    return load_tokenizer("smollm2")


@pytest.fixture(scope="session")
def smollm2():
    from sleuth.agents.policies.hf import TransformersPolicy

    return TransformersPolicy("smollm2")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """SmolLM2's architecture and tokenizer at a few MB of layers, randomly initialised (training plumbing)."""
    from sleuth.agents.policies.models import tiny_model

    return tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(autouse=True)
def _fp32_on_every_cpu(monkeypatch):
    """`deepspeed.dtype: auto` picks bf16 on a CPU with AMX-BF16: the suite's numbers must not depend on which
    machine runs it, so auto means fp32 here. The bf16 path is tested with an explicit `dtype="bf16"`."""
    from sleuth.training import zero as engine

    monkeypatch.setattr(engine, "cpu_bf16_is_fast", lambda: False)


@pytest.fixture
def serve_judge():
    """Starts scripted judges (`judge_server.ScriptedJudge`, served on loopback): `serve_judge(reply)` returns
    (judge, base URL); each is stopped at the test's end."""
    import contextlib

    from judge_server import ScriptedJudge

    from sleuth.core.net import in_thread

    with contextlib.ExitStack() as stack:
        def start(reply):
            judge = ScriptedJudge(reply)
            return judge, stack.enter_context(in_thread(judge.app()))
        yield start
