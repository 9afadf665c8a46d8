"""A sleuth tool env as a verifiers (0.4.0, v1) environment: `vf-eval sleuth.envs.outbound.vf_env` and verifiers'
`run_eval` load it by that id, like any verifiers env package (a `Taskset`, its `Harness`, its `Env`).

- Taskset (`SleuthTaskset`): one verifiers task per sleuth task of `tasks` (`--env.taskset.tasks hotpotqa:dev`),
  for the env `env` (`--env.taskset.env sleuth/DocRead-v0`), its `env_args` and `limit`. The task data holds the
  task's id and question, never its answer.
- Harness (`SleuthHarness`): the chat loop, in process: the env's instructions as the system message, its tools as
  OpenAI `tools`, each model tool call stepped through the env (`ToolSession`, so the turn budget, the observation
  of a malformed call and the verifier are the env's own) until a final tool ends the episode or the budget does.
  A reply without a tool call is given back the env's own note on it, as a sleuth episode would be.
- Rubric: `@vf.reward sleuth_score` is the env's verdict on the episode (an episode that ran out of turns gets the
  env's verdict on an empty answer), with the verdict's details as metrics.

It runs wherever `verifiers` imports (`make verifiers` builds that venv, with sleuth's core); the model is any
OpenAI-compatible server — `sleuth serve gateway --policy P` records each call token-exact on sleuth's side."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import verifiers.v1 as vf
from openai import AsyncOpenAI

from sleuth.envs.outbound.session import ToolSession, load_task_list
from sleuth.tasks.base import Task

VERDICT = "sleuth_verdict"  # the trace's info key the harness leaves the env's verdict under


@cache
def _tasks(spec: str, limit: int | None) -> tuple[Task, ...]:
    loaded = load_task_list(spec)
    return tuple(loaded[:limit] if limit else loaded)


class SleuthData(vf.TaskData):
    task_id: str = ""
    env: str = ""
    tasks: str = ""
    limit: int | None = None
    env_args: dict[str, Any] = {}


class SleuthTask(vf.Task[SleuthData]):
    @vf.reward(weight=1.0)
    async def sleuth_score(self, trace: vf.Trace) -> float:
        verdict = trace.info.get(VERDICT)
        if verdict is None:
            raise RuntimeError("the episode left no verdict: it was not run by SleuthHarness")
        return float(verdict["score"])

    @vf.metric
    async def sleuth_details(self, trace: vf.Trace) -> dict[str, float]:
        details = (trace.info.get(VERDICT) or {}).get("details", {})
        return {k: float(v) for k, v in details.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class SleuthTasksetConfig(vf.TasksetConfig):
    env: str = "sleuth/DocRead-v0"
    tasks: str = "hotpotqa:dev"
    limit: int | None = None
    env_args: dict[str, Any] = {}


class SleuthTaskset(vf.Taskset[SleuthTask, SleuthTasksetConfig]):
    def load(self):
        c = self.config
        for task in _tasks(c.tasks, c.limit):
            yield SleuthTask(SleuthData(prompt=task.question, name=task.id, task_id=task.id, env=c.env, tasks=c.tasks,
                                        limit=c.limit, env_args=c.env_args), c.task)


class SleuthHarnessConfig(vf.HarnessConfig):
    max_turns: int = 64  # a guard only: the env's own turn budget ends its episodes first


class SleuthHarness(vf.Harness[SleuthHarnessConfig]):
    NEEDS_CONTAINER = False  # the env's tools run here, in the harness's process
    EXECUTES_CODE = False  # a sleuth env that runs code runs it in sleuth's own sandbox

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **_) -> vf.ProgramResult:
        session = ToolSession(data.env, list(_tasks(data.tasks, data.limit)), **data.env_args)
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        try:
            turn = session.reset(task_id=data.task_id)
            messages: list[dict[str, Any]] = [{"role": "system", "content": session.instructions},
                                              {"role": "user", "content": turn.text}]
            tools = session.tool_schemas()
            for _ in range(self.config.max_turns):
                reply = (await client.chat.completions.create(model=ctx.model, messages=messages, tools=tools)
                         ).choices[0].message
                messages.append(reply.model_dump(exclude_none=True))
                if not reply.tool_calls:  # the env's harness says what it makes of a reply without a call
                    turn = session.act(reply.content or "")
                    messages.append({"role": "user", "content": turn.text})
                for call in reply.tool_calls or []:
                    if session.done:
                        break
                    try:
                        turn = session.call(call.function.name, json.loads(call.function.arguments or "{}"))
                    except json.JSONDecodeError:  # the env's parser sees the malformed call and says so
                        turn = session.act(f"{call.function.name} {call.function.arguments}")
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": turn.text})
                if session.done:
                    break
            verdict = turn.details.get("verdict") if session.done else None
            trace.info[VERDICT] = verdict or {"score": session.final_reward(), "details": {"unfinished": 1.0}}
        finally:
            await client.close()
            session.close()
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


class SleuthEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())  # no hosted sandbox: tools run here


class SleuthEnv(vf.Env[SleuthEnvConfig]):
    """verifiers' single-agent episode, on a local runtime by default."""

    async def run(self, task, agents) -> None:
        await agents.agent.run(task)


__all__ = ["SleuthTaskset", "SleuthHarness", "SleuthEnv"]
