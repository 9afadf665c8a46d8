"""The servers `sleuth serve` runs, each a `ServerSpec`: its flags here (so `sleuth serve --help` imports no server's
dependencies), its `build` in its own module, imported when it is served. A server another package ships registers
its spec under the entry-point group `sleuth.servers`."""

from __future__ import annotations

import argparse

from sleuth.core.args import bounded, output_dir
from sleuth.servers.base import SERVERS, ServerSpec


def _retrieval_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--index", required=True, help="an index directory (`sleuth index build`)")


def _env_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", required=True, help="an env id, or FAMILY:* for every env of a family (each session "
                   "names its own)")
    p.add_argument("--max-sessions", type=bounded(int, 1), default=64)
    p.add_argument("--session-timeout", type=bounded(float, 1), default=600.0, help="close sessions idle this long (s)")
    p.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE")


def _openenv_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", required=True)
    p.add_argument("--tasks", required=True, help="the tasks served: reset(seed=i) plays task i mod n")
    p.add_argument("--max-sessions", type=bounded(int, 1), default=64)
    p.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE")


def _verifier_flags(p: argparse.ArgumentParser) -> None:
    from sleuth.verifiers.registry import verifier_names

    p.add_argument("--name", required=True, help=f"a registered verifier: {verifier_names()}")
    p.add_argument("--workers", type=bounded(int, 1), default=4, help="records scored at once (code: sandbox runs)")


def _tinker_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2", help="the base model: smollm2 or a model directory")
    p.add_argument("--name", help="the base_model name clients ask for (default: the model's hub id for smollm2, "
                   "else --model)")
    p.add_argument("--state-dir", default="runs/tinker", help="where checkpoints live (kept across restarts)")
    p.add_argument("--sampler", choices=["transformers", "vllm"], default="transformers",
                   help="sample on the trainer's own module, or on a vLLM server loaded with verified syncs")
    p.add_argument("--vllm-python", help="a Python with vLLM (default: $SLEUTH_VLLM_PYTHON, then .venv-vllm)")
    p.add_argument("--vllm-arg", action="append", default=[], metavar="FLAG",
                   help="a flag for the vLLM server, repeatable; a flag with a value as one: "
                        "--vllm-arg=--max-num-seqs=8 (as rollout.vllm_args in a training config)")


def _gateway_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", default="smollm2", help="as sleuth eval's --policy")
    p.add_argument("--api-key", help="required of clients (and required to listen beyond loopback)")
    p.add_argument("--max-tokens", type=bounded(int, 1), default=256, help="default when a request names none")
    p.add_argument("--temperature", type=bounded(float, 0), default=1.0, help="default when a request names none")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=output_dir, help="append each ended session's trajectories to OUT/trajectories.jsonl")


for _spec in (
    ServerSpec("retrieval", "serve an index over HTTP (POST /search, POST /docs, GET /health)",
               "sleuth serve retrieval --index runs/ix --port 8000", 8000, _retrieval_flags,
               "sleuth.servers.retrieval:build"),
    ServerSpec("env", "serve an env over HTTP (sessions: reset / step / close)",
               "sleuth serve env --env sleuth/DocRead-v0 --port 8002", 8002, _env_flags, "sleuth.servers.env:build"),
    ServerSpec("openenv", "serve a tool env as an OpenEnv env (openenv-core's HTTP + WebSocket protocol; MCP "
               "call_tool / list_tools actions)",
               "sleuth serve openenv --env sleuth/DocRead-v0 --tasks hotpotqa:dev --port 8003", 8003, _openenv_flags,
               "sleuth.servers.openenv:build"),
    ServerSpec("verifier", "serve a verifier over HTTP (POST /score, POST /get_reward, GET /health)",
               "sleuth serve verifier --name qa --port 8001", 8001, _verifier_flags, "sleuth.servers.verifier:build"),
    ServerSpec("tinker", "a Tinker-compatible training + sampling server (tinker SDK 0.38.0) over one base model: LoRA "
               "clients, losses, checkpoints as tinker:// paths (docs/tinker.md)",
               "sleuth serve tinker --port 8004 --state-dir runs/tinker", 8004, _tinker_flags,
               "sleuth.servers.tinker.server:build"),
    ServerSpec("gateway", "an OpenAI-compatible endpoint over a policy that records every session",
               "sleuth serve gateway --policy smollm2 --port 8003 --out runs/gateway", 8003, _gateway_flags,
               "sleuth.servers.gateway:build"),
):
    SERVERS.register(_spec.name, _spec, "sleuth")
