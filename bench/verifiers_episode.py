"""A verifiers env's episode three ways, the same episodes and replies in one run (tests/foreign/vf_calc: an MCP
toolset, verifiers' default `bash` harness, an async rubric; a tool call, then the answer):

1. verifiers alone: `vf.Agent.run(task)` with a model client that answers at once (its own loop, no sleuth);
2. sleuth's `verifiers:` family in verifiers' venv, in process (the model requests parked and answered by
   sleuth's Env contract);
3. the same family from sleuth's main venv, behind the Remote env protocol (what `sleuth eval`/`train` use).

Seconds per episode (median of EPISODES) and ratios to (1). An episode's time is mostly verifiers starting its
harness program and the env's toolset server; the adapter's share is what (2) and (3) add to (1)."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

FOREIGN = str(Path(__file__).resolve().parents[1] / "tests" / "foreign")
EPISODES = 8
CALL = '<tool_call>\n{"name": "calc_add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


def through_sleuth() -> list[float]:
    """Episodes of `verifiers:vf-calc` made here: in process where verifiers imports, else remote."""
    import sleuth
    from sleuth.tasks import load_tasks

    env = sleuth.make("verifiers:vf-calc")
    out = []
    for seed in range(EPISODES):
        t0 = time.perf_counter()
        env.reset(options={"task": load_tasks(f"seeds:{seed % 4}")[0]})
        env.step(CALL)
        _, reward, terminated, _, _ = env.step("The sum is 3.")
        out.append(time.perf_counter() - t0)
        assert terminated
    env.close()
    return out


def verifiers_alone() -> list[float]:
    import verifiers.v1 as vf
    from verifiers.v1.interception import InterceptionServer
    from verifiers.v1.utils.loaders import harness_config_type

    from sleuth.envs.families.verifiers_env import _offline_chat_programs, _ParkingClient

    _offline_chat_programs()  # the same offline chat program as the family runs

    async def run() -> list[float]:
        config = vf.resolve_env_config({"taskset": {"id": "vf-calc"}, "agent": {"runtime": {"type": "subprocess"}}})
        rows = list(vf.load_taskset(config.taskset))
        client = vf.EvalClientConfig(base_url="http://bench.invalid/v1", api_key_var="NONE")
        requests: asyncio.Queue = asyncio.Queue()
        out = []
        async with InterceptionServer() as server:
            server.clients[client.model_dump_json()] = _ParkingClient(requests)
            agent = vf.Agent(config.agent.model_copy(update={"harness": harness_config_type("bash")(id="bash"),
                                                             "model": "m", "client": client}), interception=server)

            async def answer() -> None:  # a model that replies at once: the call, then the answer
                while True:
                    body, reply, _ = await requests.get()
                    asked = any(m.get("role") == "tool" for m in body["messages"])
                    reply.set_result({"content": "The sum is 3."} if asked else {"content": None, "tool_calls": [
                        {"id": "c1", "type": "function",
                         "function": {"name": "calc_add", "arguments": json.dumps({"a": 1, "b": 2})}}]})
            model = asyncio.create_task(answer())
            for seed in range(EPISODES):
                t0 = time.perf_counter()
                trace = await agent.run(rows[seed % 4])
                out.append(time.perf_counter() - t0)
                assert trace.ok, trace.errors
            model.cancel()
        return out
    return asyncio.run(run())


def inner() -> None:
    """In verifiers' venv: (1) and (2), as JSON on stdout."""
    print(json.dumps({"alone": verifiers_alone(), "in_process": through_sleuth()}))


def main() -> None:
    from common import cpu_name, publish

    from sleuth.envs.families.verifiers_server import verifiers_python

    os.environ["PYTHONPATH"] = FOREIGN  # the env package, for verifiers' venv and the toolset processes it starts
    done = subprocess.run([verifiers_python(), "-P", __file__, "--inner"], capture_output=True, text=True,
                          check=True)
    times = json.loads(done.stdout.strip().splitlines()[-1])
    times["remote"] = through_sleuth()
    base = statistics.median(times["alone"])
    lines = [f"CPU: {cpu_name()}; {EPISODES} episodes each, median s/episode (tests/foreign/vf_calc, `bash` harness)",
             "", "| how | s/episode | ratio to verifiers alone |", "|---|---|---|"]
    names = {"alone": "verifiers alone (`Agent.run`, a model that answers at once)",
             "in_process": "sleuth's `verifiers:` env, in verifiers' venv",
             "remote": "sleuth's `verifiers:` env from the main venv (Remote env protocol)"}
    for key, name in names.items():
        median = statistics.median(times[key])
        lines.append(f"| {name} | {median:.2f} | {median / base:.2f} |")
    publish("verifiers_episode", "verifiers env: an episode through sleuth vs verifiers alone", "\n".join(lines))


if __name__ == "__main__":
    if "--inner" in sys.argv:
        sys.path.insert(0, FOREIGN)
        inner()
    else:
        main()
