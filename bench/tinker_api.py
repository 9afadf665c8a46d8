"""The Tinker-compatible server against sleuth's own trainer, side by side in one run, on the embedded model.

1. Episodes per minute: tinker-cookbook's `rl_loop` (unchanged, through `sleuth serve tinker`; one-digit additions)
   vs `sleuth train --config reasoning_gym_grpo` (reasoning-gym's chain_sum at two one-digit terms: the same task),
   at the same budget: 4 prompts × 8 samples per step, 32 new tokens at most, LoRA rank 32 on the attention and
   MLP projections on both (the server also adapts lm_head, the Tinker client's default), `--steps` steps.
   Each arm's figure is episodes over the summed wall time of its steps (the cookbook's `time/total`, sleuth's
   rollout + reward + update + sync); the first step of each is dropped (start-up).
2. Per-call overhead of the server: a `forward_backward` + `optim_step` on one 64-token datum and a one-token
   `sample`, through the SDK and HTTP, against the same calls on the server's model object in this process.

Run: `.venv/bin/python bench/tinker_api.py [--steps 4]` (needs `make tinker`). Prints a Markdown report and keeps
it in runs/bench/tinker.md. (Not named `tinker.py`: a script's folder comes first on sys.path and would shadow the
SDK.)"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import publish

from sleuth.agents.policies.models import EMBEDDED_HUB_ID, embedded_model_dir
from sleuth.core.args import bounded
from sleuth.core.machine import cpu_name
from sleuth.core.net import free_port, wait_healthy

ROOT = Path(__file__).resolve().parents[1]
TINKER_PY = ROOT / ".venv-tinker" / "bin" / "python"
CALLS = 10
# sleuth's LoRA on the attention and MLP projections, as the Tinker client's defaults (which also adapt lm_head)
LORA = "{r: 32, alpha: 32, target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]}"
CLIENT = """
import json, os, sys, time
os.environ.setdefault("TINKER_API_KEY", "tml-local")
import tinker, torch
from tinker import TensorData, types
url, name, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
tc = tinker.ServiceClient(base_url=url).create_lora_training_client(base_model=name, rank=32, seed=0)
ids = list(range(100, 165))
d = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs={
    "target_tokens": TensorData.from_torch(torch.tensor(ids[1:])), "weights": TensorData.from_torch(torch.ones(64))})
sampler = tc.save_weights_and_get_sampling_client()
out = {"train": [], "sample": []}
for _ in range(calls + 1):
    t = time.perf_counter()
    tc.forward_backward([d], "cross_entropy").result(); tc.optim_step(types.AdamParams(learning_rate=1e-5)).result()
    out["train"].append(time.perf_counter() - t)
    t = time.perf_counter()
    sampler.sample(types.ModelInput.from_ints(ids), 1, types.SamplingParams(max_tokens=1)).result()
    out["sample"].append(time.perf_counter() - t)
print(json.dumps({k: v[1:] for k, v in out.items()}))
"""


def in_process(model_dir: str) -> dict[str, list[float]]:
    """The same calls on `LoraModels` directly: what the server adds is the difference."""
    import numpy as np

    from sleuth.servers.tinker.lora import AdapterSpec, LoraModels
    from sleuth.servers.tinker.wire import WireDatum

    models = LoraModels(model_dir, EMBEDDED_HUB_ID)
    models.create("m", AdapterSpec(EMBEDDED_HUB_ID, 32), seed=0)
    ids = np.arange(100, 165)
    d = WireDatum(ids[:-1], {"target_tokens": ids[1:], "weights": np.ones(64, np.float32)})
    out: dict[str, list[float]] = {"train": [], "sample": []}
    for _ in range(CALLS + 1):
        t = time.perf_counter()
        models.forward_backward("m", [d], "cross_entropy", {}, False)
        models.optim_step("m", 1e-5, 0.9, 0.95, 1e-12, 0.0, 0.0)
        out["train"].append(time.perf_counter() - t)
        t = time.perf_counter()
        models.sample(None, [ids.tolist()], [1], 1, 1.0, 1.0, -1, None, None)
        out["sample"].append(time.perf_counter() - t)
    return {k: v[1:] for k, v in out.items()}


def cookbook_arm(url: str, model_dir: str, steps: int, work: Path) -> float:
    config = {"batch_size": 4, "group_size": 8, "max_tokens": 32, "max_steps": steps, "save_every": 0,
              "lora_rank": 32, "log_path": str(work / "cookbook")}
    subprocess.run([str(TINKER_PY), "-P", "-W", "ignore", str(ROOT / "examples" / "tinker_cookbook" / "run_recipe.py"),
                    "rl_loop", "--base-url", url, "--model-dir", model_dir, "--config", json.dumps(config)],
                   check=True, capture_output=True, cwd=work, env={**os.environ, "SLEUTH_DATA": os.environ.get(
                       "SLEUTH_DATA", str(ROOT.parent / "shared" / "data"))})
    rows = [json.loads(x) for x in (work / "cookbook" / "metrics.jsonl").read_text().splitlines()][1:]
    return 32 * len(rows) / sum(r["time/total"] for r in rows) * 60


def sleuth_arm(steps: int, work: Path) -> float:
    subprocess.run([sys.executable, "-m", "sleuth.cli", "train", "--config", "reasoning_gym_grpo", "--out",
                    str(work / "sleuth"), "--max-steps", str(steps), "--set", f"deepspeed.lora={LORA}",
                    "--set", "checkpoint.every=0", "--set", "checkpoint.export_hf=false", "--set", "tensorboard=false"],
                   check=True, capture_output=True, cwd=ROOT)
    rows = [json.loads(x) for x in (work / "sleuth" / "metrics.jsonl").read_text().splitlines()][1:]
    wall = sum(r["time/rollout"] + r["time/reward"] + r["time/update"] + r["time/sync"] for r in rows)
    return sum(r["episodes/sampled"] for r in rows) / wall * 60


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=bounded(int, 2), default=4)
    args = ap.parse_args()
    if not TINKER_PY.exists():
        sys.exit("bench/tinker_api.py needs the tinker SDK's venv: make tinker")
    model_dir = str(embedded_model_dir())
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        server = subprocess.Popen([sys.executable, "-m", "sleuth.cli", "serve", "tinker", "--port", str(port),
                                   "--state-dir", str(work / "state")], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            wait_healthy(url, 180, server)
            calls = json.loads(subprocess.run([str(TINKER_PY), "-P", "-c", CLIENT, url, EMBEDDED_HUB_ID, str(CALLS)],
                                              check=True, capture_output=True, text=True).stdout.splitlines()[-1])
            cookbook = cookbook_arm(url, model_dir, args.steps, work)
        finally:
            server.kill()
            server.wait()
        local = in_process(model_dir)
        own = sleuth_arm(args.steps, work)
    med = {k: statistics.median(v) for k, v in calls.items()}
    loc = {k: statistics.median(v) for k, v in local.items()}
    report = "\n".join([
        f"CPU: {cpu_name()}; embedded model (SmolLM2-135M), LoRA rank 32; {args.steps} steps per arm, the first "
        "dropped.", "",
        "| arm | episodes / min | ratio |", "|---|---|---|",
        f"| tinker-cookbook rl_loop via `sleuth serve tinker` | {cookbook:.1f} | {cookbook / own:.2f}× |",
        f"| `sleuth train` (reasoning_gym_grpo, LoRA 32) | {own:.1f} | 1.00× |", "",
        f"| call (median of {CALLS}) | through the SDK + HTTP | in process | overhead |", "|---|---|---|---|",
        *[f"| {name} | {med[k] * 1e3:.0f} ms | {loc[k] * 1e3:.0f} ms | {(med[k] - loc[k]) * 1e3:+.0f} ms |"
          for k, name in (("train", "forward_backward + optim_step (64 tokens)"), ("sample", "sample (1 token)"))],
    ])
    publish("tinker", "Tinker API: cookbook recipe vs sleuth train, and the server's per-call overhead", report)


if __name__ == "__main__":
    main()
