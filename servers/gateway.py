"""`sleuth serve gateway`: the agent gateway (`agents/gateway/`, which agents and training also run in process) as a
server of its own: an OpenAI-compatible endpoint over a policy for agents in any language; each session is
recorded and its token-exact trajectories written to `--out` as it ends (`DELETE /s/{session}`)."""

from __future__ import annotations

import argparse
import ipaddress

from sleuth.core.errors import BadInput, one_line
from sleuth.servers.base import Server


def build(args: argparse.Namespace) -> Server:
    """`sleuth serve gateway`'s server from its flags (`servers.catalog`)."""
    from sleuth.agents.gateway import Gateway, create_app
    from sleuth.agents.policies.base import SamplingParams
    from sleuth.agents.policies.load import load_policy

    try:
        loopback = args.host == "localhost" or ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not args.api_key:
        raise BadInput(f"--host {args.host} listens beyond this machine: pass --api-key (any key is accepted locally)")
    try:
        policy = load_policy(args.policy, seed=args.seed)
    except Exception as e:
        raise BadInput(f"cannot load policy {args.policy!r}: {type(e).__name__}: {one_line(str(e))}") from None
    gw = Gateway(policy, SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed))
    return Server(create_app(gw, args.api_key, out=args.out),
                  f"serving {policy.name} on {{url}}/s/<session>/v1 (OpenAI chat completions)")
