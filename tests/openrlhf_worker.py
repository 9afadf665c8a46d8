"""Runs inside `.venv-verl` (which also holds OpenRLHF 0.11.2, installed without its GPU-only requirements):
fetch rewards with OpenRLHF's own client, `SingleTurnAgentExecutor`, both ways `--reward.remote_url`
allows: an HTTP URL (`_fetch_rewards_via_http`, what its rollouts call per sample) and a `.py` file
(`_fetch_rewards_via_func`). Prints the list of answers it got, as JSON.

argv[1]: a JSON file {"calls": [{"url": URL or .py path, "queries": [...], "prompts": [...], "labels": [...]}]}."""

import asyncio
import json
import sys

from openrlhf.utils.agent import SingleTurnAgentExecutor


async def fetch(call: dict) -> list:
    executor = SingleTurnAgentExecutor(remote_rm_url=call["url"])
    args = (call["queries"], call["prompts"], call["labels"])
    if executor.reward_func is not None:
        return await executor._fetch_rewards_via_func(*args)
    return await executor._fetch_rewards_via_http(*args)


async def main() -> None:
    spec = json.loads(open(sys.argv[1]).read())
    print(json.dumps([await fetch(call) for call in spec["calls"]]))


asyncio.run(main())
