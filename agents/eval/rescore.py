"""Episodes scored again by another verifier once they are over: a judge (`judge:FILE`) or any registered
verifier, in place of the env's own verdict or beside it (the judge's `env` weight). It runs where whole groups
exist — `sleuth train` after each round, `sleuth eval` as episodes finish — so a group judge sees a group's
members together, and a pointwise judge's calls go out `concurrency` at a time across episodes.

Only answered episodes are scored again (a verdict holding the response it scored); an episode that ended
without an answer keeps its reward. A judge that gives no usable answer fails the episode (a group judge: the
whole group) as `verifier_error`: an infrastructure failure, never a score."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from sleuth.agents.trajectory import Trajectory
from sleuth.tasks.base import Task
from sleuth.verifiers.base import Verdict
from sleuth.verifiers.judge import JudgeStats
from sleuth.verifiers.judge.judges import GroupJudge, PointwiseJudge
from sleuth.verifiers.registry import get_verifier, group_verifier


def transcript(t: Trajectory) -> str:
    """The episode as text: each action, and what the env answered."""
    parts = []
    for i, turn in enumerate(t.turns):
        parts.append(f"[action {i + 1}] {turn.action_text.strip()}")
        if turn.observation:
            parts.append(f"[result {i + 1}] {turn.observation.strip()}")
    return "\n".join(parts)


def _context(t: Trajectory) -> dict[str, Any]:
    ctx: dict[str, Any] = {"env_verdict": t.verdict, "transcript": transcript(t)}
    reads = [turn.read.title for turn in t.turns if turn.read is not None and turn.read.shown]
    if reads:
        ctx["evidence"] = reads
    return ctx


def _scored(t: Trajectory) -> bool:
    return not t.failed and t.verdict is not None and t.verdict.response is not None


def _with(t: Trajectory, v: Verdict | Exception) -> Trajectory:
    """`t` under its new verdict (its last turn's reward and the episode's moved by the change of score), or failed
    when the verifier gave none. The env's own details (F1, EM, support recall, ...) stay beside the new verifier's,
    which win where a name is in both: the reports still show what the env measured."""
    if isinstance(v, Exception):
        return replace(t, verdict=None, error=f"{type(v).__name__}: {v}", stop_reason="verifier_error")
    assert t.verdict is not None
    v = Verdict(v.score, {**t.verdict.details, **v.details}, response=v.response)
    delta = v.score - t.verdict.score
    turns = t.turns[:-1] + [replace(t.turns[-1], reward=t.turns[-1].reward + delta)] if t.turns else t.turns
    return replace(t, verdict=v, reward=t.reward + delta, turns=turns)


class Rescorer:
    """Scores finished episodes again with verifier `name` (a registered name or `judge:FILE`)."""

    def __init__(self, name: str, tasks: Mapping[str, Task], concurrency: int = 8):
        self.name, self.tasks, self.concurrency = name, tasks, concurrency
        self.group: GroupJudge | None = group_verifier(name)  # type: ignore[assignment]
        self.verifier = None if self.group is not None else get_verifier(name)

    def take_stats(self) -> JudgeStats | None:
        """The judge's counts since the last call (None for a verifier that is not a judge)."""
        judge = self.group or self.verifier
        return judge.take_stats() if isinstance(judge, GroupJudge | PointwiseJudge) else None

    def __call__(self, trajs: Sequence[Trajectory]) -> list[Trajectory]:
        """`trajs` with every answered episode scored again, in their order. An episode's records (an agent's
        segments) share its verdict; groups are `Trajectory.group` (the task id where none is set)."""
        episodes: dict[str, list[int]] = {}
        for i, t in enumerate(trajs):
            episodes.setdefault(t.episode or f"#{i}", []).append(i)
        # each episode scored once, through the record that holds its verdict (an agent's last segment)
        heads = {key: next((i for i in reversed(idx) if _scored(trajs[i])), None) for key, idx in episodes.items()}
        chosen = [i for i in heads.values() if i is not None]
        verdicts = self._group_verdicts(trajs, chosen) if self.group is not None else self._each(trajs, chosen)
        out = list(trajs)
        for key, idx in episodes.items():
            head = heads[key]
            if head is None:
                continue
            for i in idx:
                if _scored(trajs[i]) or isinstance(verdicts[head], Exception):
                    out[i] = _with(trajs[i], verdicts[head])
        return out

    def stream(self, episodes: Iterable[list[Trajectory]], group_size: int) -> Iterator[list[Trajectory]]:
        """Whole episodes in, the same episodes scored again out: a task's are held until `group_size` of them
        are in (a group judge sees them together) and scored with others once `concurrency` episodes wait."""
        waiting: dict[str, list[list[Trajectory]]] = {}
        ready: list[list[Trajectory]] = []
        for episode in episodes:
            key = episode[0].task_id
            waiting.setdefault(key, []).append(episode)
            if len(waiting[key]) >= group_size:
                ready += waiting.pop(key)
            if len(ready) >= max(self.concurrency, group_size):
                yield from self._scored_episodes(ready)
                ready = []
        ready += [e for group in waiting.values() for e in group]
        if ready:
            yield from self._scored_episodes(ready)

    def _scored_episodes(self, episodes: list[list[Trajectory]]) -> Iterator[list[Trajectory]]:
        scored = self([t for e in episodes for t in e])
        at = 0
        for e in episodes:
            yield scored[at:at + len(e)]
            at += len(e)

    def _each(self, trajs: Sequence[Trajectory], chosen: list[int]) -> dict[int, Verdict | Exception]:
        assert self.verifier is not None
        verifier = self.verifier

        def one(i: int) -> Verdict:
            t = trajs[i]
            assert t.verdict is not None and t.verdict.response is not None
            return verifier(self.tasks[t.task_id], t.verdict.response, **_context(t))

        if isinstance(verifier, PointwiseJudge):
            got = verifier.client.map(one, chosen)
        else:
            got = [_safe(one, i) for i in chosen]
        return dict(zip(chosen, got, strict=True))

    def _group_verdicts(self, trajs: Sequence[Trajectory], chosen: list[int]) -> dict[int, Verdict | Exception]:
        assert self.group is not None
        judge = self.group
        by_group: dict[str, list[int]] = {}
        for i in chosen:
            by_group.setdefault(trajs[i].group or trajs[i].task_id, []).append(i)

        def one(members: list[int]) -> list[Verdict]:
            first = trajs[members[0]]
            return judge.score_group(self.tasks[first.task_id], [trajs[i].verdict.response or "" for i in members],
                                     [_context(trajs[i]) for i in members])

        got = judge.client.map(one, list(by_group.values()))
        out: dict[int, Verdict | Exception] = {}
        for members, verdicts in zip(by_group.values(), got, strict=True):
            for k, i in enumerate(members):
                out[i] = verdicts if isinstance(verdicts, Exception) else verdicts[k]
        return out


def _safe(fn: Any, i: int) -> Verdict | Exception:
    try:
        return fn(i)
    except Exception as e:  # a verifier that cannot score this episode fails the episode, not the run
        return e
