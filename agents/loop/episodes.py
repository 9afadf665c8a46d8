"""The agent loop: many envs against one policy, each finished episode yielded as an exact token-level
`Trajectory` as soon as it ends.

The loop is continuous: an episode's next request goes to the policy as soon as its env step returns,
env steps run (in `env_threads` threads) while the engine generates for other episodes, and a finished
episode's slot takes the next task at once. The state lives in `EpisodeScheduler`, the requests go
through `RequestQueue`; what is here only moves results between them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from functools import partial

import gymnasium

from sleuth.agents.chat import ChatRenderer
from sleuth.agents.loop.scheduler import Branch, Episode, EpisodeScheduler, StepOutcome, TaskFeed
from sleuth.agents.loop.steps import INLINE_WAIT_S, EnvSteps
from sleuth.agents.policies.base import Policy, SamplingParams
from sleuth.agents.policies.requests import RequestQueue, Sampled, WeightsGate
from sleuth.agents.trajectory import Trajectory
from sleuth.tasks.base import Task

# The default wall clock per episode, reset to end, for evaluation and training alike: past it an episode fails as
# `timeout` (never scored). Half an hour holds the slowest shipped episodes (SWE test suites) with room to spare
# and stops a runaway one (an env that never ends, a tool that never returns) before it holds a run for hours.
EPISODE_TIMEOUT_S = 1800.0


def run_episodes(
    make_env: Callable[[], gymnasium.Env],
    tasks: Iterable[Task | Branch] | TaskFeed,
    policy: Policy,
    sampling: SamplingParams | None = None,
    concurrency: int = 8,
    env_id: str = "",
    max_context: int | None = None,
    env_threads: int = 0,
    lockstep: bool = False,
    gate: WeightsGate | None = None,
    episode_timeout_s: float | None = None,
) -> Iterator[Trajectory]:
    """Yield one Trajectory per task, in completion order. An episode whose env fails to reset or step, or
    whose generation fails, yields a failed trajectory (`error` set, `Trajectory.failed`): nothing is
    silently dropped and nothing failed is scored. `max_context` (default: the policy's) ends an episode
    whose next request would not fit, the first one included (`stop_reason` "prompt_too_long"), before it
    is sent. `env_threads` > 0 steps envs in that many threads, concurrently
    with generation: worth it when steps wait on something (env servers, sandboxes, SWE tests); in-process
    steps of microseconds are faster inline. `lockstep` releases requests in rounds (every episode waits
    for the slowest of its round): the benchmarks' measure of what the continuous loop saves. `gate`: a weight
    update that holds it waits for the calls in flight and holds new ones back (async training).
    `tasks` is read lazily, as slots free: it may be an endless stream; a `Branch` among them continues a
    recorded episode from one of its turns. `episode_timeout_s`: an episode still running that long after its
    reset (stuck in its env step or its generation) fails as `timeout` — an infrastructure failure, never scored
    — its env closed and its step thread left behind (`EnvSteps`). With `env_threads` 0 a step runs on a thread
    of its own and the loop waits for it, up to `INLINE_WAIT_S`; resets too."""
    sampling = sampling or SamplingParams()
    sched = EpisodeScheduler(make_env, tasks, ChatRenderer(policy.tokenizer), concurrency=concurrency, env_id=env_id,
                             max_context=max_context or policy.max_context or 1 << 30,
                             max_tokens=sampling.max_tokens, barrier=lockstep)
    engine = RequestQueue(policy, sampling, gate)
    steps = EnvSteps(max(1, env_threads))
    inflight: dict[Future, tuple[Episode, Sampled | None]] = {}  # a generation (None) or an env step
    try:
        while not sched.done:
            sched.admit()
            yield from sched.pop_finished()
            ready = sched.take_ready()
            for ep, fut in zip(ready, engine.submit([ep.request() for ep in ready]), strict=True):
                inflight[fut] = (ep, None)
            if not (inflight or sched.resetting):
                if not sched.done and not sched.running:
                    sched.feed.wait(0.1)  # a feed with nothing for now (nothing else can happen meanwhile)
                continue
            began = min([ep.started for ep, _ in inflight.values()] + [r[3] for r in sched.resetting.values()])
            wait([*inflight, *sched.resetting], return_when=FIRST_COMPLETED, timeout=None if episode_timeout_s is None
                 else max(0.0, began + episode_timeout_s - time.perf_counter()))
            sched.poll_resets(episode_timeout_s)
            for fut in sorted(engine.done(inflight), key=lambda f: inflight[f][0].index):
                ep, sampled = inflight.pop(fut)
                if sampled is not None:  # an env step returned
                    sched.on_step(ep, sampled.generation, sampled.version, fut.result())
                    continue
                try:
                    sampled = fut.result()  # a generation came back
                except Exception as e:  # the call failed: its episodes fail, the run goes on
                    sched.on_generation_failed(ep, e)
                    continue
                stepping = steps.submit(partial(_step, ep.env, sampled.generation.text))
                if not env_threads:  # waited for here (the batches stay those of stepping inline), up to a limit
                    wait([stepping], timeout=INLINE_WAIT_S)
                    if stepping.done():
                        sched.on_step(ep, sampled.generation, sampled.version, stepping.result())
                        continue
                    steps.release(stepping)  # it goes on in the background
                inflight[stepping] = (ep, sampled)
            if episode_timeout_s is not None:
                now = time.perf_counter()
                for fut, (ep, sampled) in list(inflight.items()):
                    if now - ep.started >= episode_timeout_s:
                        del inflight[fut]
                        if sampled is None:  # stuck in its generation: its result, if it ever comes, is dropped
                            sched.on_timeout(ep, episode_timeout_s)
                        else:  # stuck in its env step
                            steps.release(fut)
                            sched.on_timeout(ep, episode_timeout_s, sampled.generation, sampled.version)
    finally:
        engine.close()
        steps.close()
        sched.close()


def _step(env: gymnasium.Env, action: str) -> StepOutcome | BaseException:
    try:
        return StepOutcome.from_gym(env.step(action))
    except Exception as e:  # reported per episode by the scheduler
        return e
