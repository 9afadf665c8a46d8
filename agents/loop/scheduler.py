"""`EpisodeScheduler`: the state of a run's episodes — tasks waiting for an env, episodes running (ready
for their next generation, generating, or stepping their env), trajectories finished — and the rules that
move an episode between them. The driver loop (`agents/loop/episodes.py`) only moves data between the scheduler,
the request queue and the env steps.

Two admission rules. Continuous (the default): an episode's next request is ready as soon as its env step
returns, and a free slot takes the next task at once. Lock-step (`barrier=True`, what the loop did
before): requests are released in rounds, only when no episode of the round is still generating or
stepping, and new tasks are admitted only between rounds; kept so the two can be measured side by side."""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any

import gymnasium

from sleuth.agents.chat import ChatRenderer
from sleuth.agents.loop.steps import INLINE_WAIT_S, in_background
from sleuth.agents.policies.base import Generation, Request
from sleuth.agents.trajectory import ReadEvent, Trajectory, Turn
from sleuth.core.errors import InfraFailure
from sleuth.envs.outcome import ResetInfo, extras, reset_info, step_info
from sleuth.tasks.base import Task
from sleuth.verifiers.base import Verdict


@dataclass(frozen=True)
class Branch:
    """An episode that starts where a recorded one stood after `at` of its turns: the env is reset with the
    task and steps the recorded actions again, each reply checked against the record (an env that replies
    otherwise cannot be branched: the branch fails as `replay_error`), and the policy samples on from the
    recorded context ids. Its trajectory's prompt is that whole context (only the new turns train) and its
    reward starts at the recorded turns' rewards."""

    of: Trajectory
    task: Task
    at: int
    group: str = ""  # the branch's group key (default: the task id)

    def __post_init__(self) -> None:
        if not 0 < self.at < len(self.of.turns):  # a branch samples again from a recorded turn on
            raise ValueError(f"a branch point must lie between two of the episode's {len(self.of.turns)} turns, "
                             f"got {self.at}")


class TaskFeed:
    """Where a run's tasks come from, polled as slots free. This one reads an iterable; a feed that may
    have nothing for a while (tasks issued only as a trainer takes results) overrides `poll` and `wait`."""

    def __init__(self, tasks: Iterable[Task | Branch] = ()):
        self._it = iter(tasks)

    def poll(self, n: int) -> list[Task | Branch] | None:
        """Up to `n` tasks available now: [] if none yet, None once the feed has ended."""
        out = [t for _, t in zip(range(n), self._it, strict=False)]
        return out if out or n == 0 else None

    def wait(self, timeout_s: float) -> None:
        """Block until `poll` may have something (up to `timeout_s`)."""


class ReplayError(InfraFailure):
    """A branch's env replied to a recorded action otherwise than it had."""


@dataclass
class StepOutcome:
    """One env step as the loop uses it: the gymnasium 5-tuple with the env's `StepInfo` (`envs.outcome`) as
    fields. `info` keeps the env's own facts for the trajectory record."""

    reward: float
    terminated: bool
    truncated: bool
    messages: list[dict[str, Any]]  # what the policy sees next (empty when the episode ended)
    read: ReadEvent | None
    tool_call: dict[str, Any] | None
    error: str | None
    verdict: Verdict | None
    legal_actions: Sequence[str] | None  # what a text env accepts next, where it says (`envs/families`)
    stop_reason: str | None  # why the env ended the episode, where it names it (e.g. `invalid_actions`)
    info: dict[str, Any]

    @classmethod
    def from_gym(cls, step: tuple[Any, Any, Any, Any, dict[str, Any]]) -> StepOutcome:
        _, reward, terminated, truncated, info = step
        o = step_info(info)
        return cls(float(reward), bool(terminated), bool(truncated), list(o.messages),
                   ReadEvent.from_info(o.read) if o.read else None, o.tool_call, o.error, o.verdict, o.legal_actions,
                   o.stop_reason, extras(info))


@dataclass
class Episode:
    index: int  # the task's position in the run: fixes its sampling seed whatever the batching
    env: gymnasium.Env
    task: Task
    traj: Trajectory
    context: list[int]
    messages: list[dict[str, Any]]
    start: ResetInfo
    started: float = field(default_factory=time.perf_counter)
    first_turn: int = 0  # turns before the trajectory's first (a branch's replayed ones)
    legal_actions: Sequence[str] | None = None  # from the last reset or step

    def request(self) -> Request:
        return Request(self.context, self.messages, self.task, self.first_turn + len(self.traj.turns),
                       self.start, self.index, self.legal_actions)


class EpisodeScheduler:
    def __init__(self, make_env: Callable[[], gymnasium.Env], tasks: Iterable[Task | Branch] | TaskFeed,
                 renderer: ChatRenderer, *, concurrency: int, env_id: str, max_context: int, max_tokens: int,
                 barrier: bool = False):
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.make_env, self.renderer, self.env_id = make_env, renderer, env_id
        self.concurrency, self.max_context, self.max_tokens, self.barrier = (
            concurrency, max_context, max_tokens, barrier)
        # resets still running after INLINE_WAIT_S: their future, and (index, task, env, when it began)
        self.resetting: dict[Future, tuple[int, Task | Branch, gymnasium.Env, float]] = {}
        self.feed = tasks if isinstance(tasks, TaskFeed) else TaskFeed(tasks)  # read lazily, as slots free
        self._ended = False
        self._admitted = 0
        self.ready: deque[Episode] = deque()
        self.busy = 0  # episodes generating or stepping
        self.finished: deque[Trajectory] = deque()
        self._idle_envs: list[gymnasium.Env] = []
        self._live: dict[int, Episode] = {}

    @property
    def done(self) -> bool:
        return self._ended and not (self._live or self.finished or self.resetting)

    @property
    def running(self) -> int:
        return len(self._live) + len(self.resetting)

    def admit(self) -> None:
        """Reset envs for waiting tasks while there is room (between rounds only, under the barrier)."""
        if self.barrier and self.busy:
            return
        began: list[Future] = []
        while not self._ended and self.running < self.concurrency:
            got = self.feed.poll(self.concurrency - self.running)
            if got is None:
                self._ended = True
            began += [self._admit(task) for task in got or ()]
            if not got:
                break
        if self._ended:  # no task will use an idle env again: what it holds (a server's session) goes now
            while self._idle_envs:
                with contextlib.suppress(Exception):
                    self._idle_envs.pop().close()
        if began:  # waited for together: resets that wait (a server with one session) cost one wait, not one each
            wait(began, timeout=INLINE_WAIT_S)
            self.poll_resets(None)

    def _admit(self, item: Task | Branch) -> Future:
        """Reset an env for `item` on a thread of its own (started by `poll_resets` once it returns)."""
        index, self._admitted = self._admitted, self._admitted + 1
        task = item.task if isinstance(item, Branch) else item
        env = self._idle_envs.pop() if self._idle_envs else self.make_env()
        resetting = in_background(lambda: env.reset(options={"task": task}))
        self.resetting[resetting] = (index, item, env, time.perf_counter())
        return resetting

    def poll_resets(self, timeout_s: float | None) -> None:
        """Start the episodes whose background reset returned (in task order); fail as `timeout` those whose
        reset is still running `timeout_s` after it began, their env closed."""
        now = time.perf_counter()
        for fut in sorted(self.resetting, key=lambda f: self.resetting[f][0]):
            index, item, env, began = self.resetting[fut]
            if fut.done():
                del self.resetting[fut]
                self._start(index, item, env, fut, began)
            elif timeout_s is not None and now - began >= timeout_s:
                del self.resetting[fut]
                self._failed_start(item, env, "timeout", f"reset did not return within rollout.episode_timeout_s "
                                                         f"({timeout_s:g} s); its env is closed")

    def _failed_start(self, item: Task | Branch, env: gymnasium.Env, reason: str, error: str) -> None:
        """An episode that never started: recorded, its env dropped (its state is unknown)."""
        with contextlib.suppress(Exception):
            env.close()
        task = item.task if isinstance(item, Branch) else item
        self.finished.append(Trajectory(task.id, self.env_id, [], error=error, stop_reason=reason,
                                        group=(item.group if isinstance(item, Branch) else "") or task.id,
                                        branch_at=item.at if isinstance(item, Branch) else 0))

    def _start(self, index: int, item: Task | Branch, env: gymnasium.Env, reset: Future, began: float) -> None:
        """The episode of `item` on its reset env (`reset`: the reset's future, done)."""
        task = item.task if isinstance(item, Branch) else item
        try:
            _, info = reset.result()
            start = reset_info(info)
            messages = list(start.messages)
            if isinstance(item, Branch):
                messages = self._replay(env, item, messages)
        except Exception as e:  # bad task data or a dead env server: record it, drop the env (its state is unknown)
            replay = isinstance(e, ReplayError)
            self._failed_start(item, env, "replay_error" if replay else "reset_error",
                               f"{'replay' if replay else 'reset'} failed: {type(e).__name__}: {e}")
            return
        if isinstance(item, Branch):
            done = item.of.turns[:item.at]
            ids = item.of.prompt_ids + [i for t in done for i in (*t.action_ids, *t.observation_ids)]
            traj = Trajectory(task_id=task.id, env_id=self.env_id, prompt_ids=ids, group=item.group or task.id,
                              reward=sum(t.reward for t in done), branch_at=item.at)
        else:
            tools = start.tools if start.format == "template" else None  # the template shows them
            ids = self.renderer.prompt_ids(messages, tools)
            traj = Trajectory(task_id=task.id, env_id=self.env_id, prompt_ids=ids, group=task.id)
        ep = Episode(index, env, task, traj, list(ids), messages, start, started=began,
                     first_turn=item.at if isinstance(item, Branch) else 0, legal_actions=start.legal_actions)
        self._live[index] = ep
        if len(ids) + self.max_tokens > self.max_context:  # never sent: the engine could not take it
            traj.stop_reason = "prompt_too_long"
            traj.meta["prompt_too_long"] = (f"the first prompt is {len(ids)} tokens; with max_tokens {self.max_tokens} "
                                            f"it does not fit the policy's context of {self.max_context}")
            self._finish(ep, False, True, None)
            return
        self.ready.append(ep)

    def _replay(self, env: gymnasium.Env, branch: Branch, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Step `env` through the branch's recorded turns; the messages the policy has seen after them."""
        for k, turn in enumerate(branch.of.turns[:branch.at]):
            o = StepOutcome.from_gym(env.step(turn.action_text))
            if o.terminated or o.truncated or self.renderer.observation_ids(o.messages, turn.action_ids) != \
                    turn.observation_ids:
                raise ReplayError(f"turn {k} of the recorded episode replied otherwise when stepped again: the env "
                                  "is not deterministic given its task and actions, so it cannot be branched")
            messages = [*messages, {"role": "assistant", "content": turn.action_text}, *o.messages]
        return messages

    def take_ready(self) -> list[Episode]:
        """The episodes whose next request may go now (all of a round at once under the barrier)."""
        if self.barrier and self.busy:
            return []
        out = sorted(self.ready, key=lambda ep: ep.index)  # a batch's order never depends on step timing
        self.ready.clear()
        self.busy += len(out)
        return out

    def on_step(self, ep: Episode, gen: Generation, version: int, outcome: StepOutcome | BaseException) -> None:
        """Record the turn `gen` made and what its env step returned; finish the episode or make it ready."""
        self.busy -= 1
        if isinstance(outcome, BaseException):  # the env itself failed (a dead env server): end this episode
            turn = Turn(gen.ids, gen.logprobs, gen.text, policy_version=version, finish_reason=gen.finish_reason,
                        error=f"env failed: {type(outcome).__name__}: {outcome}")
            ep.traj.turns.append(turn)
            self._fail(ep, "env_error", turn.error)
            return
        o = outcome
        turn = Turn(gen.ids, gen.logprobs, gen.text, tool_call=o.tool_call, error=o.error, reward=o.reward,
                    info=o.info, policy_version=version, finish_reason=gen.finish_reason, read=o.read)
        ep.traj.turns.append(turn)
        ep.traj.reward += o.reward
        if o.terminated or o.truncated:
            if turn.read is not None:  # e.g. the budget ran out on this read: nobody saw the document
                turn.read.shown = False
            ep.traj.stop_reason = o.stop_reason or ""
            self._finish(ep, o.terminated, o.truncated, o.verdict)
            return
        turn.observation = "\n".join(m["content"] for m in o.messages)
        turn.observation_ids = self.renderer.observation_ids(o.messages, gen.ids)
        ep.messages = [*ep.messages, {"role": "assistant", "content": gen.text}, *o.messages]
        ep.legal_actions = o.legal_actions
        ep.context = ep.context + gen.ids + turn.observation_ids
        if len(ep.context) + self.max_tokens <= self.max_context:
            self.ready.append(ep)
            return
        if turn.read is not None:  # the next turn never comes: the document was never seen
            turn.read.shown = False
        ep.traj.stop_reason = "context_limit"
        self._finish(ep, False, True, None)

    def on_generation_failed(self, ep: Episode, error: Exception) -> None:
        """The engine could not generate `ep`'s next turn (a dead server, an engine error): the episode fails."""
        self.busy -= 1
        self._fail(ep, "engine_error", f"engine failed: {type(error).__name__}: {error}")

    def on_timeout(self, ep: Episode, timeout_s: float, gen: Generation | None = None, version: int = 0) -> None:
        """`ep` ran past its deadline, stuck in its generation or (`gen`: the turn it generated, recorded with the
        failure) in the env step after it: it fails, never scored."""
        self.busy -= 1
        error = f"the episode ran past rollout.episode_timeout_s ({timeout_s:g} s); its env is closed"
        if gen is not None:
            ep.traj.turns.append(Turn(gen.ids, gen.logprobs, gen.text, policy_version=version,
                                      finish_reason=gen.finish_reason, error=error))
        self._fail(ep, "timeout", error)

    def _fail(self, ep: Episode, reason: str, error: str | None) -> None:
        """End `ep` as failed for infrastructure reasons: no answer, so never scored; its env is dropped (its
        state is unknown)."""
        ep.traj.stop_reason, ep.traj.error = reason, error
        with contextlib.suppress(Exception):
            ep.env.close()
        self._finish(ep, False, True, None, reuse_env=False)

    def pop_finished(self) -> list[Trajectory]:
        out = list(self.finished)
        self.finished.clear()
        return out

    def close(self) -> None:
        """Close every env this run made (idle and, after an interruption, live)."""
        resetting = [env for _, _, env, _ in self.resetting.values()]
        for env in [*self._idle_envs, *(ep.env for ep in self._live.values()), *resetting]:
            with contextlib.suppress(Exception):
                env.close()
        self._idle_envs.clear()

    def _finish(self, ep: Episode, terminated: bool, truncated: bool, verdict: Verdict | None,
                reuse_env: bool = True) -> None:
        ep.traj.terminated, ep.traj.truncated = terminated, truncated
        ep.traj.stop_reason = ep.traj.stop_reason or ("final" if terminated else "budget")
        ep.traj.verdict = verdict
        ep.traj.meta["wall_s"] = round(time.perf_counter() - ep.started, 3)
        del self._live[ep.index]
        if reuse_env:
            self._idle_envs.append(ep.env)
        self.finished.append(ep.traj)
