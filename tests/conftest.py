import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

sys.path.insert(0, str(Path(__file__).resolve().parent))  # shared helpers (train_helpers) under importlib mode

if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    # `pytest -n N`: N test processes share the machine's cores; torch's intra-op threads (one per core each by
    # default) would outnumber the cores N-fold and spin waiting for each other. Each worker, and each process a
    # test starts (they inherit the environment), gets its share of the cores instead.
    _SHARE = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    os.environ["OMP_NUM_THREADS"] = _SHARE
    os.environ["MKL_NUM_THREADS"] = _SHARE


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files that hold a `long` test run first (`make test` passes `--no-loadscope-reorder` so that xdist keeps
    this order): a file of minutes started last would run alone at the end while the other worker idles."""
    long_files = {item.path for item in items if item.get_closest_marker("long")}
    items.sort(key=lambda item: item.path not in long_files)  # stable: each file's own order is kept


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


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for a file's in-process Ray tests, which `placement.connect` reuses: started once per file, not
    per test. Each test's pool closes by killing its actors and removing its placement group, so no test's kills
    reach the next; tests that run `sleuth` in a subprocess start (and stop) a Ray of their own."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)  # 2 workers of 1 CPU
    yield
    ray.shutdown()
