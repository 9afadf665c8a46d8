"""`sleuth serve ...`: the servers (retrieval, env, OpenEnv, verifier, Tinker, gateway), each a thin start-up of its
module's own server with one-line failures."""

from __future__ import annotations

import argparse
from pathlib import Path

from sleuth.cli.args import bounded, one_line, output_dir
from sleuth.cli.args import fail as _fail
from sleuth.cli.args import parse_kv as _kv


def cmd_serve_retrieval(args: argparse.Namespace) -> int:
    from sleuth.envs.retrieval.base import read_meta
    from sleuth.envs.retrieval.index import load_index
    from sleuth.servers.retrieval import serve

    try:
        meta = read_meta(Path(args.index))
        index = load_index(args.index)
    except (FileNotFoundError, ValueError, KeyError) as e:
        return _fail(f"cannot load index {args.index}: {e}")
    print(f"serving {meta['kind']} index {args.index} on http://{args.host}:{args.port}", flush=True)
    serve(index, args.host, args.port, info={"kind": meta["kind"], "n_docs": meta.get("n_docs")})
    return 0


def cmd_serve_env(args: argparse.Namespace) -> int:
    from sleuth.servers.env import serve

    try:
        env_kwargs = _kv(args.env_arg)
        print(f"serving {args.env} on http://{args.host}:{args.port} (at most {args.max_sessions} sessions)",
              flush=True)
        serve(args.env, args.host, args.port, env_kwargs, args.max_sessions, args.session_timeout)
    except Exception as e:  # a bad env id or argument: say so instead of a traceback
        return _fail(f"cannot serve {args.env}: {type(e).__name__}: {e}")
    return 0


def cmd_serve_openenv(args: argparse.Namespace) -> int:
    try:
        from sleuth.servers.openenv import create_app

        app = create_app(args.env, args.tasks, args.max_sessions, **_kv(args.env_arg))
    except Exception as e:  # a missing extra, a bad env id, task spec or argument: one line, not a traceback
        return _fail(f"cannot serve {args.env} as an OpenEnv env: {type(e).__name__}: {e}")
    import uvicorn

    print(f"serving {args.env} over {args.tasks} as an OpenEnv env on http://{args.host}:{args.port} "
          f"(at most {args.max_sessions} sessions)", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def cmd_serve_verifier(args: argparse.Namespace) -> int:
    from sleuth.servers.verifier import serve
    from sleuth.verifiers.registry import get_verifier

    try:
        get_verifier(args.name)
    except (LookupError, ImportError) as e:  # an unknown name (with the closest one), or a plugin that does not load
        return _fail(one_line(str(e)))
    print(f"serving the {args.name} verifier on http://{args.host}:{args.port}", flush=True)
    serve(args.name, args.host, args.port, args.workers)
    return 0


def cmd_serve_tinker(args: argparse.Namespace) -> int:
    """A Tinker-compatible training and sampling server (the tinker SDK's protocol) over one base model; no such
    model, or a vLLM sampler that cannot start, is a `SleuthError` the command ends with."""
    try:
        from sleuth.servers.tinker.server import serve
    except ImportError as e:  # the `tinker` extra (the SDK's wire types) is not installed
        return _fail(f"sleuth serve tinker needs the tinker SDK's types: pip install 'sleuth[tinker]' ({e})")
    serve(args.model, args.name, args.host, args.port, Path(args.state_dir), args.sampler, args.vllm_python)
    return 0


def cmd_serve_gateway(args: argparse.Namespace) -> int:
    """An OpenAI-compatible endpoint over a policy for agents in any language; sessions are recorded and
    their token-exact trajectories written to `--out` as each session ends (`DELETE /s/{session}`)."""
    import ipaddress

    import uvicorn

    from sleuth.agents.gateway import Gateway, create_app
    from sleuth.agents.policies.base import SamplingParams
    from sleuth.agents.policies.load import load_policy

    try:
        loopback = args.host == "localhost" or ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not args.api_key:
        return _fail(f"--host {args.host} listens beyond this machine: pass --api-key (any key is accepted locally)")
    try:
        policy = load_policy(args.policy, seed=args.seed)
    except Exception as e:
        return _fail(f"cannot load policy {args.policy!r}: {type(e).__name__}: {one_line(str(e))}")
    gw = Gateway(policy, SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed))
    print(f"serving {policy.name} on http://{args.host}:{args.port}/s/<session>/v1 (OpenAI chat completions)",
          flush=True)
    uvicorn.run(create_app(gw, args.api_key, out=args.out), host=args.host, port=args.port, log_level="warning")
    return 0


def add_serve_parsers(sub: argparse._SubParsersAction, verifiers: str) -> None:
    sv = sub.add_parser("serve", help="run a server").add_subparsers(dest="serve_command", required=True)
    r = sv.add_parser("retrieval", help="serve an index over HTTP (POST /search, POST /docs, GET /health)")
    r.add_argument("--index", required=True)
    r.add_argument("--host", default="127.0.0.1")
    r.add_argument("--port", type=bounded(int, 0), default=8000)
    r.set_defaults(fn=cmd_serve_retrieval)
    en = sv.add_parser("env", help="serve an env over HTTP (sessions: reset / step / close)")
    en.add_argument("--env", required=True)
    en.add_argument("--host", default="127.0.0.1")
    en.add_argument("--port", type=bounded(int, 0), default=8002)
    en.add_argument("--max-sessions", type=bounded(int, 1), default=64)
    en.add_argument("--session-timeout", type=bounded(float, 1), default=600.0,
                    help="close sessions idle this long (s)")
    en.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE")
    en.set_defaults(fn=cmd_serve_env)
    oe = sv.add_parser("openenv", help="serve a tool env as an OpenEnv env (openenv-core's HTTP + WebSocket "
                       "protocol; MCP call_tool / list_tools actions)")
    oe.add_argument("--env", required=True)
    oe.add_argument("--tasks", required=True, help="the tasks served: reset(seed=i) plays task i mod n")
    oe.add_argument("--host", default="127.0.0.1")
    oe.add_argument("--port", type=bounded(int, 0), default=8003)
    oe.add_argument("--max-sessions", type=bounded(int, 1), default=64)
    oe.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE")
    oe.set_defaults(fn=cmd_serve_openenv)
    v = sv.add_parser("verifier", help="serve a verifier over HTTP (POST /score, POST /get_reward, GET /health)")
    v.add_argument("--name", required=True, help=f"a registered verifier: {verifiers}")
    v.add_argument("--host", default="127.0.0.1")
    v.add_argument("--port", type=bounded(int, 0), default=8001)
    v.add_argument("--workers", type=bounded(int, 1), default=4, help="records scored at once (code: sandbox runs)")
    v.set_defaults(fn=cmd_serve_verifier)
    tn = sv.add_parser("tinker", help="a Tinker-compatible training + sampling server (tinker SDK 0.38.0) over one "
                       "base model: LoRA clients, losses, checkpoints as tinker:// paths (docs/tinker.md)")
    tn.add_argument("--model", default="smollm2", help="the base model: smollm2 or a model directory")
    tn.add_argument("--name", help="the base_model name clients ask for (default: the model's hub id for smollm2, "
                    "else --model)")
    tn.add_argument("--host", default="127.0.0.1")
    tn.add_argument("--port", type=bounded(int, 0), default=8004)
    tn.add_argument("--state-dir", default="runs/tinker", help="where checkpoints live (kept across restarts)")
    tn.add_argument("--sampler", choices=["transformers", "vllm"], default="transformers",
                    help="sample on the trainer's own module, or on a vLLM server loaded with verified syncs")
    tn.add_argument("--vllm-python", help="a Python with vLLM (default: $SLEUTH_VLLM_PYTHON, then .venv-vllm)")
    tn.set_defaults(fn=cmd_serve_tinker)
    gw = sv.add_parser("gateway", help="an OpenAI-compatible endpoint over a policy that records every session")
    gw.add_argument("--policy", default="smollm2", help="as sleuth eval's --policy")
    gw.add_argument("--host", default="127.0.0.1")
    gw.add_argument("--port", type=bounded(int, 0), default=8003)
    gw.add_argument("--api-key", help="required of clients (and required to listen beyond loopback)")
    gw.add_argument("--max-tokens", type=bounded(int, 1), default=256, help="default when a request names none")
    gw.add_argument("--temperature", type=bounded(float, 0), default=1.0, help="default when a request names none")
    gw.add_argument("--seed", type=int, default=0)
    gw.add_argument("--out", type=output_dir, help="append each ended session's trajectories to OUT/trajectories.jsonl")
    gw.set_defaults(fn=cmd_serve_gateway)
