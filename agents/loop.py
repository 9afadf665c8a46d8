"""The agent loop: many envs against one policy, generation batched across every live episode, each
finished episode yielded as an exact token-level `Trajectory` as soon as it ends."""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import gymnasium

from sleuth.agents.chat import ChatRenderer
from sleuth.agents.policy import Policy, Request, SamplingParams
from sleuth.agents.trajectory import ReadEvent, Trajectory, Turn
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
    env_workers: int = 0,
) -> Iterator[Trajectory]:
    """Yield one Trajectory per task, in completion order. A task whose env fails to reset yields a
    trajectory with `error` set, an env that fails mid-episode a truncated one with the reason (nothing is
    silently dropped). `max_context` (default: the policy's) truncates an episode whose next turn would
    not fit. `env_workers` > 0 steps the envs of a round in that many threads: worth it when steps wait
    on something (env servers, sandboxes); in-process steps of microseconds are faster inline."""
    sampling = sampling or SamplingParams()
    renderer = ChatRenderer(policy.tokenizer)
    limit = max_context or policy.max_context or 1 << 30
    pending = deque(tasks)
    idle: list[gymnasium.Env] = []
    live: list[_Episode] = []
    pool = ThreadPoolExecutor(env_workers, thread_name_prefix="sleuth-env") if env_workers > 0 else None
    try:
        yield from _loop(make_env, pending, policy, sampling, concurrency, env_id, renderer, limit, idle, live, pool)
    finally:
        if pool:
            pool.shutdown(wait=False)


def _step(pair: tuple[_Episode, Any]) -> Any:
    ep, gen = pair
    try:
        return ep.env.step(gen.text)
    except Exception as e:  # reported per episode by the caller
        return e


def _loop(make_env: Callable[[], gymnasium.Env], pending: deque, policy: Policy, sampling: SamplingParams,
          concurrency: int, env_id: str, renderer: ChatRenderer, limit: int, idle: list, live: list[_Episode],
          pool: ThreadPoolExecutor | None) -> Iterator[Trajectory]:
    """The rounds: top up live episodes, one batched generation for all, step every env, record."""
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
        pairs = list(zip(live, generations, strict=True))
        outcomes = pool.map(_step, pairs) if pool else map(_step, pairs)
        for (ep, gen), outcome in zip(pairs, outcomes, strict=True):
            if isinstance(outcome, Exception):  # the env itself failed (a dead env server): end this episode
                e = outcome
                turn = Turn(gen.ids, gen.logprobs, gen.text, policy_version=policy.version,
                            finish_reason=gen.finish_reason, error=f"env failed: {type(e).__name__}: {e}")
                ep.traj.turns.append(turn)
                ep.traj.stop_reason = "env_error"
                ep.traj.meta["env_error"] = turn.error
                with contextlib.suppress(Exception):
                    ep.env.close()
                yield _finish(ep, False, True, {}, [])  # the broken env is not reused
                continue
            _, reward, terminated, truncated, info = outcome
            new_messages = info.pop("messages", [])
            read = info.pop("read", None)
            turn = Turn(gen.ids, gen.logprobs, gen.text, tool_call=info.get("tool_call"), error=info.get("error"),
                        reward=float(reward), info=info, policy_version=policy.version, finish_reason=gen.finish_reason,
                        read=ReadEvent.from_info(read) if read else None)
            ep.traj.turns.append(turn)
            ep.traj.reward += float(reward)
            if terminated or truncated:
                if turn.read is not None:  # e.g. the budget ran out on this read: nobody saw the document
                    turn.read.shown = False
                yield _finish(ep, terminated, truncated, info, idle)
                continue
            turn.observation = "\n".join(m["content"] for m in new_messages)
            turn.observation_ids = renderer.observation_ids(new_messages, gen.ids)
            ep.messages += [{"role": "assistant", "content": gen.text}, *new_messages]
            ep.context += gen.ids + turn.observation_ids
            if len(ep.context) + sampling.max_tokens <= limit:
                still.append(ep)
            else:
                if turn.read is not None:  # the next turn never comes: the document was never seen
                    turn.read.shown = False
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
