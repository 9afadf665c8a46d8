"""Held-out evaluation: run a policy on tasks, append each finished trajectory to
`trajectories.jsonl` at once (so an interrupted run resumes where it stopped), then summarise.

A run directory records what it is a run of (`run.json`: env, env arguments, harness, policy and a
fingerprint of its weights, tasks, limit, sampling, samples); resuming into a directory that holds another
run's episodes is refused, so one directory never reports two runs as one.

An episode is one trajectory in an env, and one or more in an agent run through the gateway (`evaluate_agent`:
an agent that rewrote its history has a segment per unbroken chain of calls, each carrying the episode's
`episode` and verdict). Counts, means, pass@k and resume are per episode, never per segment."""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import gymnasium
from tqdm import tqdm

from sleuth.agents.eval.breakdown import breakdown, pass_at_ks
from sleuth.agents.eval.rescore import Rescorer
from sleuth.agents.loop.episodes import EPISODE_TIMEOUT_S, run_episodes
from sleuth.agents.policies.base import Policy, SamplingParams
from sleuth.agents.trajectory import Trajectory
from sleuth.core.errors import BadInput
from sleuth.core.net import retry_counts
from sleuth.core.rundir import RunDirLock
from sleuth.tasks.base import Task
from sleuth.verifiers.qa import normalize_answer


def load_trajectories(path: Path) -> list[Trajectory]:
    """Read a trajectories file, skipping a torn last line left by a killed run."""
    out = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(Trajectory.from_json(line))
            except (json.JSONDecodeError, TypeError, KeyError):
                continue
    return out


def episodes(trajs: Iterable[Trajectory]) -> list[list[Trajectory]]:
    """`trajs` grouped by episode, in order of first appearance: the records sharing an `episode` (an
    agent episode's segments) together, every other trajectory alone (an env episode)."""
    groups: dict[Any, list[Trajectory]] = {}
    for i, t in enumerate(trajs):
        groups.setdefault(t.episode or ("env episode", i), []).append(t)
    return list(groups.values())


def complete(group: Sequence[Trajectory]) -> bool:
    """Whether an episode has every record it wrote (`segments`; 1 for an env episode): a killed run
    can leave an agent episode's last records unwritten."""
    return len(group) == group[0].segments


def episode_metrics(t: Trajectory, *segments: Trajectory) -> dict[str, float]:
    """Per-episode numbers: the verdict's score and every numeric detail (EM/F1/recall for QA, tests
    passed for code, ...), plus what the turns did. An agent episode's later segments follow `t`: they carry
    the same verdict, and their turns and tokens add up."""
    m = {"score": t.verdict.score if t.verdict else 0.0}
    for key, value in (t.verdict.details if t.verdict else {}).items():
        if isinstance(value, (int, float)) and key != "wall_s":
            m[key] = float(value)
    parts = (t, *segments)
    turns = [turn for part in parts for turn in part.turns]
    reads = [turn.read for turn in turns if turn.read]
    if reads:
        m.update(reads=float(len(reads)), gold_reads=float(sum(bool(r.gold) for r in reads)),
                 rereads=float(sum(r.reread for r in reads)))
    known = [r.answer for r in reads if r.shown and r.answer is not None]
    if known:  # defined where a shown document could hold the answer as a span (not for yes/no answers)
        m["answer_read"] = float(any(known))
    titles = {normalize_answer(r.title) for r in reads if r.shown and r.title}
    prediction = t.verdict.details.get("prediction") if t.verdict else None
    if titles and isinstance(prediction, str) and normalize_answer(prediction):
        # a small reader's shortcut: answering with the name of a document it was shown, not a span inside it
        m["title_answer"] = float(normalize_answer(prediction) in titles)
    calls = sum(turn.tool_call is not None and turn.error is None for turn in turns)
    errors = sum(turn.error is not None for turn in turns)
    if calls + errors:
        m["valid_call_share"] = calls / (calls + errors)
    m.update(
        turns=float(len(turns)),
        tool_errors=float(errors),
        tool_calls=float(calls),
        answered=float(t.terminated),
        policy_tokens=float(sum(part.num_policy_tokens for part in parts)),
        total_tokens=float(sum(len(part.token_ids()) for part in parts)),
    )
    m["tool_error_share"] = m["tool_errors"] / m["turns"] if m["turns"] else 0.0
    return m


def summarise(trajs: Sequence[Trajectory], wall_time_s: float, meta: dict[str, Any]) -> dict[str, Any]:
    """Means over the episodes that ran (`n`, episodes: an agent episode's segments count once); failed
    episodes (`Trajectory.failed`: no answer) are counted apart in `n_failed` and score nothing. Where reads
    report whether they held the answer, `answer_read_rate` is the share of the episodes that read anything
    whose shown documents held it, and `score_when_answer_read` their mean score: reading and extracting the
    answer, apart; `title_answer_rate` is the share of the answers (of episodes shown a titled document) that
    are the title of a document shown, not a span inside one. Two tool-call
    error rates, because they answer different questions: `tool_error_rate_turns` pools every turn of the run
    (invalid calls / turns), and `tool_error_rate_episodes` averages each episode's own share (what
    `sleuth compare` pairs by task). Agent runs add their calls, segments and splits per episode."""
    groups = episodes(trajs)
    ok_groups = [g for g in groups if not g[0].failed]
    ok = [t for g in ok_groups for t in g]
    rows = [episode_metrics(*g) for g in ok_groups]
    n = len(rows)
    keys = list(dict.fromkeys(k for r in rows for k in r))

    def mean(key: str) -> float:  # an episode without the key (e.g. no reads) counts as 0
        return round(sum(r.get(key, 0.0) for r in rows) / n, 4) if n else 0.0

    summary: dict[str, Any] = {**meta, "n": n, "n_failed": len(groups) - n,
                               "n_prompt_too_long": sum(g[0].stop_reason == "prompt_too_long" for g in ok_groups),
                               "stop_reasons": dict(sorted(Counter(g[0].stop_reason for g in groups).items()))}
    skip = {"reads", "gold_reads", "rereads", "turns", "tool_errors", "answered", "policy_tokens", "total_tokens",
            "tool_error_share", "answer_read", "title_answer", "valid_call_share"}
    summary.update({k: mean(k) for k in keys if k not in skip})
    if any(turn.read for t in ok for turn in t.turns) or meta.get("env", "").endswith("DocRead-v0"):
        summary.update(mean_reads=mean("reads"), mean_gold_reads=mean("gold_reads"), mean_rereads=mean("rereads"))
    known = [r for r in rows if "answer_read" in r]
    if known:
        held = [r["score"] for r in known if r["answer_read"]]
        summary.update(answer_read_rate=round(sum(r["answer_read"] for r in known) / len(known), 4),
                       score_when_answer_read=round(sum(held) / len(held), 4) if held else 0.0)
    titled = [r["title_answer"] for r in rows if "title_answer" in r]
    if titled:
        summary["title_answer_rate"] = round(sum(titled) / len(titled), 4)
    turns = sum(r["turns"] for r in rows)
    tried = [r["valid_call_share"] for r in rows if "valid_call_share" in r]
    summary.update(
        mean_turns=mean("turns"),
        answered_rate=mean("answered"),
        tool_error_rate_turns=round(sum(r["tool_errors"] for r in rows) / turns, 4) if turns else 0.0,
        tool_error_rate_episodes=mean("tool_error_share"),
        # of the turns that tried to call a tool, the share whose call was valid (a named, offered tool and
        # arguments that parse; a tool's own error, where the env runs the tools), averaged over the episodes
        # that tried: what a warm start for tool calls must raise
        valid_call_share=round(sum(tried) / len(tried), 4) if tried else 0.0,
        policy_tokens=int(sum(r["policy_tokens"] for r in rows)),
        total_tokens=int(sum(r["total_tokens"] for r in rows)),
        wall_time_s=round(wall_time_s, 2),
    )
    agent_episodes = [g for g in ok_groups if "calls" in g[0].meta]
    if agent_episodes:  # records per episode: 1 unless the agent rewrote its history (a split per new segment)
        k = len(agent_episodes)
        summary.update(mean_calls=round(sum(g[0].meta["calls"] for g in agent_episodes) / k, 4),
                       mean_segments=round(sum(len(g) for g in agent_episodes) / k, 4),
                       splits=sum(int(g[0].meta.get("splits", 0)) for g in agent_episodes),
                       n_no_calls=sum(g[0].stop_reason == "no_calls" for g in agent_episodes))
    return summary


RUN_FILE = "run.json"


class RunMismatchError(BadInput):
    """The output directory holds episodes of a different run."""


def check_run_identity(out: Path, identity: dict[str, Any], has_episodes: bool) -> None:
    """Refuse to resume into `out` when its episodes belong to another run; record `identity` otherwise."""
    path = out / RUN_FILE
    if has_episodes:
        if not path.exists():
            raise RunMismatchError(f"{out} holds episodes of an unrecorded run (no {RUN_FILE}): pass --no-resume to "
                                   "start over there, or choose another --out")
        old = json.loads(path.read_text(encoding="utf-8"))
        diff = [k for k in sorted(set(old) | set(identity)) if old.get(k) != identity.get(k)]
        if diff:
            said = "; ".join(f"{k}: {old.get(k)!r} there, {identity.get(k)!r} now" for k in diff)
            raise RunMismatchError(f"{out} holds another run's episodes ({said}): choose another --out, or pass "
                                   "--no-resume to replace them")
    path.write_text(json.dumps(identity, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def policy_identity(spec: str) -> dict[str, Any]:
    """The policy as a run's identity sees it: its spec, and for a local model directory its absolute path
    and a hash of its weights and config (a retrained model in the same place is another policy; the same
    weights exported again are not)."""
    path = Path(spec)
    if not path.is_dir():
        return {"spec": spec}
    digest = hashlib.sha256()
    for p in sorted(path.iterdir()):
        if p.is_file() and (p.suffix in (".safetensors", ".bin", ".gguf") or p.name == "config.json"):
            digest.update(p.name.encode())
            with open(p, "rb") as f:
                digest.update(hashlib.file_digest(f, "sha256").digest())
    return {"spec": spec, "path": str(path.resolve()), "weights": digest.hexdigest()[:16]}


def evaluate_env(
    make_env: Callable[[], gymnasium.Env],
    tasks: Sequence[Task],
    policy: Policy,
    out_dir: str | Path,
    sampling: SamplingParams | None = None,
    concurrency: int = 8,
    env_id: str = "",
    meta: dict[str, Any] | None = None,
    resume: bool = True,
    progress: bool = True,
    samples: int = 1,
    env_threads: int = 0,
    identity: dict[str, Any] | None = None,
    episode_timeout_s: float | None = EPISODE_TIMEOUT_S,
    rescore: Rescorer | None = None,
) -> dict[str, Any]:
    """Evaluate and write `trajectories.jsonl`, `summary.json`, `report.md` and `report.png` in `out_dir`.
    `samples` episodes per task (pass@k is reported; sampling needs temperature > 0 or a seeded scripted
    policy, else the samples are one episode repeated). `identity` (what this run is; `sleuth eval` passes it)
    is checked against the directory's before resuming (`RunMismatchError`). The directory is owned by this
    call (`RunDirBusyError` if another process holds it). Failed episodes (`Trajectory.failed`) are
    counted in `n_failed`, never scored, and retried by the next resume (the failed records move to
    `failed.jsonl`). An episode still running `episode_timeout_s` after its reset fails as `timeout` (None: no
    limit). `rescore`: the episodes scored again once over (a judge; a group judge sees a task's samples
    together), its counts in the summary's `judge`."""
    def run(todo: list[Task]) -> Iterator[Trajectory]:
        return run_episodes(make_env, todo, policy, sampling, concurrency, env_id, env_threads=env_threads,
                            episode_timeout_s=episode_timeout_s)

    return _evaluate_run(run, tasks, out_dir, f"eval {policy.name}",
                         {"policy": policy.name, "env": env_id, "samples": samples, **(meta or {})},
                         resume, progress, samples, identity, rescore)


def evaluate_agent(
    agent: Callable[[dict[str, Any], str], Any],
    tasks: Sequence[Task],
    policy: Policy,
    out_dir: str | Path,
    verifier: str,
    sampling: SamplingParams | None = None,
    concurrency: int = 8,
    agent_name: str = "",
    meta: dict[str, Any] | None = None,
    resume: bool = True,
    progress: bool = True,
    samples: int = 1,
    identity: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`evaluate` for an agent of the user's own (`agents.gateway.agent_runner.AgentFn`): each episode runs it against
    the gateway over `policy` (served in this process on a loopback port while episodes remain), its answer
    scored by the registered `verifier`; the same run directory, identity check, resume, failed-episode
    retry, summary and report. `sampling` is the gateway's default for what a call leaves unset."""
    from sleuth.agents.gateway import Gateway, create_app
    from sleuth.agents.gateway.agent_runner import run_agent_episodes
    from sleuth.core.net import in_thread

    def run(todo: list[Task]) -> Iterator[Trajectory]:
        if not todo:  # a finished run resumed: nothing to serve
            return
        gateway = Gateway(policy, sampling)
        try:
            with in_thread(create_app(gateway)) as url:
                yield from run_agent_episodes(agent, todo, gateway, url, verifier, concurrency)
        finally:
            gateway.close()

    return _evaluate_run(run, tasks, out_dir, f"eval {agent_name or 'agent'} on {policy.name}",
                         {"policy": policy.name, "env": f"agent {agent_name}".strip(), "agent": agent_name,
                          "verifier": verifier, "samples": samples, **(meta or {})},
                         resume, progress, samples, identity)


def _by_episode(trajs: Iterable[Trajectory]) -> Iterator[list[Trajectory]]:
    """A stream of trajectories as whole episodes: an agent episode's records arrive one after another."""
    group: list[Trajectory] = []
    for t in trajs:
        group.append(t)
        if complete(group):
            yield group
            group = []
    if group:
        raise RuntimeError(f"episode {group[0].episode} ended after {len(group)} of its "
                           f"{group[0].segments} records")


def _evaluate_run(run: Callable[[list[Task]], Iterator[Trajectory]], tasks: Sequence[Task], out_dir: str | Path,
                  desc: str, meta: dict[str, Any], resume: bool, progress: bool, samples: int,
                  identity: dict[str, Any] | None, rescore: Rescorer | None = None) -> dict[str, Any]:
    """What `evaluate` and `evaluate_agent` share: the run directory, resume, the episodes `run(todo)` yields
    (each appended whole, at once) and the summary and report over episodes."""
    from sleuth.agents.eval.report import write_report

    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError("task ids repeat: results are keyed by task id (load_tasks refuses or de-duplicates them)")
    out = Path(out_dir)
    with RunDirLock(out):
        traj_path, summary_path = out / "trajectories.jsonl", out / "summary.json"
        loaded = load_trajectories(traj_path) if resume else []
        if identity is not None:
            check_run_identity(out, identity, bool(loaded))
        whole = [g for g in episodes(loaded) if complete(g)]  # a torn episode runs again
        done = [t for g in whole if not g[0].failed for t in g]
        retried = [t for g in whole if g[0].failed for t in g]
        if retried:  # kept, not lost: the record of each failure, beside the run
            with open(out / "failed.jsonl", "a", encoding="utf-8") as f:
                f.writelines(t.to_json() + "\n" for t in retried)
        # rewritten whole: without any torn last line or episode, or the failed episodes being retried
        traj_path.write_text("".join(t.to_json() + "\n" for t in done), encoding="utf-8")
        previous_wall = 0.0
        if resume and done and summary_path.exists():
            previous_wall = float(json.loads(summary_path.read_text()).get("wall_time_s", 0.0))
        have = Counter(g[0].task_id for g in episodes(done))
        todo = [t for t in tasks for _ in range(max(0, samples - have[t.id]))]
        total = len(tasks) * samples
        start = time.perf_counter()
        retries0 = retry_counts()
        with open(traj_path, "a", encoding="utf-8") as f, tqdm(total=total, initial=total - len(todo),
                                                               desc=desc, disable=not progress) as bar:
            finished = _by_episode(run(todo))
            for group in (rescore.stream(finished, samples) if rescore is not None else finished):
                for traj in group:
                    traj.meta["sample"] = have[traj.task_id]
                have[group[0].task_id] += 1
                f.write("".join(traj.to_json() + "\n" for traj in group))  # one write: an episode lands whole
                f.flush()
                done += group
                bar.update(1)
        wall = previous_wall + time.perf_counter() - start
        order = {t.id: i for i, t in enumerate(tasks)}
        done.sort(key=lambda t: (order.get(t.task_id, len(order)), t.meta.get("sample", 0), t.segment))
        summary = summarise(done, wall, meta)
        summary["http_retries"] = {k: v - retries0.get(k, 0) for k, v in retry_counts().items()
                                   if v > retries0.get(k, 0)}
        summary["retried_failed"] = len(retried)
        judged = rescore.take_stats() if rescore is not None else None
        if judged is not None:
            summary["judge"] = judged.metrics()
        firsts = [g[0] for g in episodes(done)]  # pass@k and breakdowns count episodes
        summary.update(pass_at_ks(firsts))
        summary["breakdown"] = breakdown(firsts, tasks)
        summary_path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        write_report(out, summary, done)
    return summary
