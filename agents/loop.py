"""The agent loop: many envs against one policy, generation batched across every live episode, each
finished episode yielded as an exact token-level `Trajectory` as soon as it ends."""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import gymnasium

from sleuth.agents.chat import ChatRenderer
from sleuth.agents.policy import Policy, Request, SamplingParams
from sleuth.agents.trajectory import Trajectory, Turn
from sleuth.tasks.base import Task


@dataclass
class _Episode:
    env: gymnasium.Env
    task: Task
    traj: Trajectory
    context: list[int]
    messages: list[dict[str, Any]]
    reset_info: dict[str, Any]
    started: float = field(default_factory=time.perf_counter)


def run_episodes(
    make_env: Callable[[], gymnasium.Env],
    tasks: Iterable[Task],
    policy: Policy,
    sampling: SamplingParams | None = None,
    concurrency: int = 8,
    env_id: str = "",
    max_context: int | None = None,
) -> Iterator[Trajectory]:
    """Yield one Trajectory per task, in completion order. A task whose env fails to reset yields a
    trajectory with `error` set (nothing is silently dropped). `max_context` (default: the policy's)
    truncates an episode whose next turn would not fit."""
    sampling = sampling or SamplingParams()
    renderer = ChatRenderer(policy.tokenizer)
    limit = max_context or getattr(policy, "max_context", None) or 1 << 30
    pending = deque(tasks)
    idle: list[gymnasium.Env] = []
    live: list[_Episode] = []
    while pending or live:
        while pending and len(live) < concurrency:
            task = pending.popleft()
            if not idle:
                idle.append(make_env())
            env = idle.pop()
            try:
                _, info = env.reset(options={"task": task})
            except Exception as e:  # bad task data: record it, drop the env (its state is unknown), go on
                env.close()
                yield Trajectory(task.id, env_id, [], error=f"reset failed: {type(e).__name__}: {e}",
                                 stop_reason="error", group=task.id)
                continue
            ids = renderer.prompt_ids(info["messages"])
            traj = Trajectory(task_id=task.id, env_id=env_id, prompt_ids=ids, group=task.id)
            live.append(_Episode(env, task, traj, list(ids), list(info["messages"]), info))
        if not live:
            continue
        requests = [Request(ep.context, ep.messages, ep.task, len(ep.traj.turns), ep.reset_info) for ep in live]
        generations = policy.generate(requests, sampling)
        still: list[_Episode] = []
        for ep, gen in zip(live, generations, strict=True):
            try:
                _, reward, terminated, truncated, info = ep.env.step(gen.text)
            except Exception as e:  # the env itself failed (a dead env server): end this episode, keep the rest
                turn = Turn(gen.ids, gen.logprobs, gen.text, policy_version=policy.version,
                            finish_reason=gen.finish_reason, error=f"env failed: {type(e).__name__}: {e}")
                ep.traj.turns.append(turn)
                ep.traj.stop_reason = "env_error"
                ep.traj.meta["env_error"] = turn.error
                with contextlib.suppress(Exception):
                    ep.env.close()
                yield _finish(ep, False, True, {}, [])  # the broken env is not reused
                continue
            new_messages = info.pop("messages", [])
            turn = Turn(gen.ids, gen.logprobs, gen.text, tool_call=info.get("tool_call"), error=info.get("error"),
                        reward=float(reward), info=info, policy_version=policy.version, finish_reason=gen.finish_reason)
            ep.traj.turns.append(turn)
            ep.traj.reward += float(reward)
            if terminated or truncated:
                yield _finish(ep, terminated, truncated, info, idle)
                continue
            turn.observation = "\n".join(m["content"] for m in new_messages)
            turn.observation_ids = renderer.observation_ids(new_messages, gen.ids)
            ep.messages += [{"role": "assistant", "content": gen.text}, *new_messages]
            ep.context += gen.ids + turn.observation_ids
            if len(ep.context) + sampling.max_tokens <= limit:
                still.append(ep)
            else:
                ep.traj.stop_reason = "context_limit"
                yield _finish(ep, False, True, {}, idle)
        live = still


def _finish(ep: _Episode, terminated: bool, truncated: bool, info: dict[str, Any], idle: list) -> Trajectory:
    ep.traj.terminated, ep.traj.truncated = terminated, truncated
    ep.traj.stop_reason = ep.traj.stop_reason or ("final" if terminated else "budget")
    ep.traj.verdict = info.get("verdict")
    ep.traj.meta["wall_s"] = round(time.perf_counter() - ep.started, 3)
    idle.append(ep.env)
    return ep.traj
