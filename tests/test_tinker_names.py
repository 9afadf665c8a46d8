"""`sleuth serve tinker --model smollm2` answers to the name the user typed as well as to the model's full name:
the Tinker SDK (tinker 0.38.0, which the main venv holds for the server's wire types) against the real server."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sleuth.agents.policies.models import EMBEDDED_HUB_ID
from sleuth.core.net import free_port, wait_healthy

tinker = pytest.importorskip("tinker")


def test_the_server_takes_the_name_it_was_started_with_and_the_full_name(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "sleuth.cli", "serve", "tinker", "--model", "smollm2", "--port",
                             str(port), "--state-dir", str(tmp_path)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_healthy(url, 300, proc)
        sc = tinker.ServiceClient(base_url=url, api_key="tml-local")
        for name in ("smollm2", EMBEDDED_HUB_ID):
            tc = sc.create_lora_training_client(base_model=name, rank=1).result()
            assert tc.get_info().model_data.model_name == EMBEDDED_HUB_ID  # one model, reported by its full name
            sampler = sc.create_sampling_client(base_model=name)
            assert len(sampler.compute_logprobs(tinker.types.ModelInput.from_ints([1, 2, 3])).result()) == 3
        with pytest.raises(Exception, match="not served here; this server serves 'HuggingFaceTB/SmolLM2-135M-Instruct'"
                           " or 'smollm2'"):
            sc.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=1).result()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
