"""Evaluation as a Python API: `sleuth.evaluate(...)` runs what `sleuth eval` runs (each policy × harness, or each
policy behind a user's agent, on held-out tasks) and returns what it prints, as an `EvalResult`. The command is a
thin face over it: flags in, this call, the result printed.

What cannot run is a `BadInput` (one line; nothing written); episodes that failed on infrastructure are counted in
each summary's `n_failed`, never scored, and named in `EvalResult.failures` (the same call retries them)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sleuth.agents.loop.episodes import EPISODE_TIMEOUT_S
from sleuth.agents.policies.base import Policy, SamplingParams
from sleuth.core.errors import BadInput, one_line
from sleuth.core.rundir import RunDirLock
from sleuth.tasks.base import Task

DEFAULT_ENV, DEFAULT_HARNESS = "sleuth/DocRead-v0", "json"
# A policy by name and what releases it (Ray workers, say); the default loads it in this process
PolicyLoader = Callable[[str], tuple[Policy, Callable[[], None]]]


@dataclass
class EvalResult:
    """What an evaluation wrote and what `sleuth eval` prints of it."""

    out: Path
    summaries: list[dict[str, Any]]  # one per policy × harness, as each run's summary.json
    report: Path  # report.md of one run, comparison.md of several
    failures: list[str] = field(default_factory=list)  # runs with episodes that failed (not scored; retried)
    bfcl_tables: list[str] = field(default_factory=list)  # BFCL's leaderboard table per run of `bfcl:` items


@dataclass
class Agent:
    """A user's agent run through the gateway instead of an env: `entrypoint` (`module:function`, imported from
    `path`) or `command` (a program run in `path` per episode); its answers are scored by `verifier`."""

    entrypoint: str | None = None
    command: str | None = None
    path: str = "."


def evaluate(tasks: str | Sequence[Task], policies: str | Sequence[str] = "smollm2", *, out: str | Path,
             env: str | None = None, harness: str | Sequence[str] | None = None,
             env_args: dict[str, Any] | None = None, agent: Agent | None = None, verifier: str | None = None,
             limit: int | None = None, dedupe: bool = False, samples: int = 1, max_tokens: int = 64,
             temperature: float = 0.0, seed: int = 0, concurrency: int = 8, env_threads: int = 0,
             resume: bool = True, episode_timeout_s: float | None = EPISODE_TIMEOUT_S,
             load: PolicyLoader | None = None) -> EvalResult:
    """Evaluate each of `policies` (names, model directories, hub ids; a comma list) in `env` under each harness,
    or behind `agent`, on `tasks` (a spec such as `hotpotqa:test`, or tasks), into `out` (a sub-folder per run
    when there are several). `verifier` scores an agent's answers, or an env's episodes again (a judge)."""
    from sleuth.tasks import load_tasks

    names = [p.strip() for p in (policies.split(",") if isinstance(policies, str) else policies) if p.strip()]
    env, harnesses, spec = _resolve(tasks, env, harness, agent, verifier, samples, temperature, names)
    runner = _agent_runner(agent) if agent is not None else None
    if isinstance(tasks, str) or tasks is None:
        try:
            loaded = load_tasks(spec, limit=limit, dedupe=dedupe)
        except (FileNotFoundError, ValueError) as e:
            raise BadInput(str(e)) from None
        except Exception as e:  # e.g. a malformed JSONL line, reported by datasets
            raise BadInput(f"cannot load tasks {spec!r}: {type(e).__name__}: {e}") from None
    else:
        loaded = list(tasks)[:limit]
    if not loaded:
        raise BadInput(f"no tasks in {spec!r}")
    if runner is None:
        import sleuth

        try:
            sleuth.make(env, **(env_args or {})).close()  # a bad env id or argument, before any model loads
        except Exception as e:
            raise BadInput(f"cannot build env {env!r}: {type(e).__name__}: {e}") from None
    sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed)
    settings = _Settings(spec, limit, samples, sampling, concurrency, env_threads, resume, episode_timeout_s,
                         verifier, env or "", dict(env_args or {}))
    return _runs(Path(out), loaded, names, harnesses, settings, load or _load_here(seed), runner, agent)


@dataclass
class _Settings:
    tasks: str
    limit: int | None
    samples: int
    sampling: SamplingParams
    concurrency: int
    env_threads: int
    resume: bool
    episode_timeout_s: float | None
    verifier: str | None
    env: str
    env_args: dict[str, Any]

    def identity(self, spec: str) -> dict[str, Any]:
        from sleuth.agents.eval.episodes import policy_identity

        s = self.sampling
        return {"policy": policy_identity(spec), "tasks": self.tasks, "limit": self.limit, "samples": self.samples,
                "sampling": {"max_tokens": s.max_tokens, "temperature": s.temperature, "seed": s.seed}}


def _resolve(tasks: str | Sequence[Task] | None, env: str | None, harness: str | Sequence[str] | None,
             agent: Agent | None, verifier: str | None, samples: int, temperature: float,
             policies: list[str]) -> tuple[str, list[str], str]:
    """(env, harnesses, task spec) with the defaults filled in, or the one line that says why the options do not
    go together. An agent is its own harness, tools and prompt, scored by the verifier it names."""
    from sleuth.agents.policies.load import SCRIPTED_POLICIES
    from sleuth.envs.families import family_of
    from sleuth.verifiers.base import CannotScore
    from sleuth.verifiers.registry import get_verifier, group_verifier, verifier_names

    if not policies:
        raise BadInput("no policy to evaluate")
    if samples > 1 and temperature == 0:
        raise BadInput(f"--samples {samples} at --temperature 0 would be {samples} copies of one greedy episode "
                       "(pass@k of identical samples): sample with --temperature > 0, e.g. 0.7")
    spec = tasks if isinstance(tasks, str) else "tasks" if tasks is not None else None
    if agent is not None:
        if (agent.entrypoint is None) == (agent.command is None):
            raise BadInput("an agent is an entry point (module:function) or a command: give one")
        if env is not None or harness is not None:
            raise BadInput("an agent brings its own tools and prompt (its episodes run through the gateway, not an "
                           "env): leave the env and harness out")
        if spec is None:
            raise BadInput("an agent needs --tasks (e.g. hotpotqa:test)")
        if verifier is None:
            raise BadInput(f"an agent needs a verifier (--verifier NAME) to score its answers (one of "
                           f"{verifier_names()})")
        try:
            get_verifier(verifier)
        except (LookupError, ValueError, CannotScore) as e:  # an unknown name, a bad judge file, a group judge
            raise BadInput(str(e)) from None
        scripted = [p for p in policies if p in SCRIPTED_POLICIES]
        if scripted:
            raise BadInput(f"policy {scripted[0]} is a scripted baseline of sleuth's envs; an agent needs a model "
                           "behind the gateway (smollm2, a model directory or a hub id)")
        return "", [""], spec
    if verifier is not None:  # the env's episodes scored again, e.g. by a judge
        try:
            group = group_verifier(verifier)
            if group is None:
                get_verifier(verifier)
        except (LookupError, ValueError, CannotScore) as e:
            raise BadInput(str(e)) from None
        if group is not None and samples < 2:
            raise BadInput(f"{verifier} is a group judge: it compares the samples of a task, so it needs "
                           "--samples K (K ≥ 2, with --temperature > 0)")
    env = env or DEFAULT_ENV
    family = family_of(env)
    names = harness if harness is not None else (family.harness if family else DEFAULT_HARNESS)
    harnesses = [h.strip() for h in (names.split(",") if isinstance(names, str) else names) if h.strip()]
    if spec is None:
        if not (family and family.seeded):
            raise BadInput(f"--tasks is required for {env} (e.g. hotpotqa:test, or a Task JSONL)")
        if family.rows:
            raise BadInput(f"--tasks is required for {env}: the rows of its task set it plays (e.g. seeds:0-9)")
        spec = "seeds:test"  # an env that makes its own episodes: seeds 0, 1, 2, ... (limit N)
    return env, harnesses, spec


def _agent_runner(agent: Agent) -> Any:
    from sleuth.agents.gateway.agent_runner import CommandAgent, load_agent

    return load_agent(agent.entrypoint, agent.path) if agent.entrypoint else CommandAgent(agent.command, agent.path)


def _load_here(seed: int) -> PolicyLoader:
    from sleuth.agents.policies.load import load_policy

    return lambda spec: (load_policy(spec, seed=seed), lambda: None)


def _runs(out: Path, tasks: list[Task], policies: list[str], harnesses: list[str], s: _Settings,
          load: PolicyLoader, runner: Any, agent: Agent | None) -> EvalResult:
    """Each policy × harness into `out`; `out` is owned by this process from the moment the first policy has
    loaded, so a refused policy writes nothing."""
    from sleuth.agents.eval.report import write_comparison

    multi = len(policies) * len(harnesses) > 1
    names = _run_names(policies)
    result = EvalResult(out, [], out / ("comparison.md" if multi else "report.md"))
    lock, owned = RunDirLock(out), False
    with contextlib.ExitStack() as stack:  # what the loaded policies hold (Ray workers), released at the end
        stack.callback(lambda: lock.release() if owned else None)
        for spec in policies:
            try:
                policy, release = load(spec)
            except Exception as e:  # a missing path, an unreachable hub id, a directory without weights
                raise BadInput(f"cannot load policy {spec!r}: {type(e).__name__}: {one_line(str(e))}") from None
            if not owned:
                try:
                    lock.acquire()
                except OSError as e:  # the run directory cannot be made (a read-only or virtual file system)
                    raise BadInput(f"cannot write the run to {out}: {e.strerror or e}") from None
                owned = True
            stack.callback(release)
            for harness in harnesses:
                run = f"{names[spec]}-{harness}" if harness else names[spec]
                _one_run(result, out / run if multi else out, run, spec, policy, harness, tasks, s, runner, agent)
        if multi:
            write_comparison(out, result.summaries)
    return result


def _one_run(result: EvalResult, run_dir: Path, run: str, spec: str, policy: Policy, harness: str,
             tasks: list[Task], s: _Settings, runner: Any, agent: Agent | None) -> None:
    import sleuth
    from sleuth.agents.eval.episodes import evaluate_agent, evaluate_env, load_trajectories
    from sleuth.agents.eval.rescore import Rescorer
    from sleuth.agents.gateway.agent_runner import agent_identity

    identity = s.identity(spec)
    try:
        if runner is not None and agent is not None:
            name = agent.entrypoint or agent.command or ""
            summary = evaluate_agent(runner, tasks, policy, run_dir, s.verifier, s.sampling, s.concurrency, name,
                                     meta={"tasks": s.tasks, "run": run}, resume=s.resume, samples=s.samples,
                                     identity={**identity, **agent_identity(name, runner), "verifier": s.verifier})
        else:
            rescore = Rescorer(s.verifier, {t.id: t for t in tasks}, s.concurrency) if s.verifier else None
            summary = evaluate_env(
                lambda: sleuth.make(s.env, harness=harness, **s.env_args), tasks, policy, run_dir, s.sampling,
                s.concurrency, s.env, meta={"tasks": s.tasks, "harness": harness, "run": run}, resume=s.resume,
                samples=s.samples, env_threads=s.env_threads, rescore=rescore,
                identity={**identity, "env": s.env, "env_args": s.env_args, "harness": harness,
                          **({"verifier": s.verifier} if s.verifier else {})},
                episode_timeout_s=s.episode_timeout_s)
    except BadInput:
        raise
    except ValueError as e:  # e.g. a baseline that does not apply to this env
        raise BadInput(f"{run}: {e} (finished episodes are kept in {run_dir})") from None
    except OSError as e:  # the output cannot be written (a read-only or virtual file system)
        raise BadInput(f"cannot write the run to {run_dir}: {e.strerror or e}") from None
    result.summaries.append(summary)
    if tasks and all(t.source.startswith("bfcl/") for t in tasks):  # BFCL items: the leaderboard table
        from sleuth.agents.eval.bfcl_table import bfcl_report

        result.bfcl_tables.append(bfcl_report([run_dir], run_dir))
    if summary["n_failed"]:  # no answer from these: retried by the same call, never scored
        errors = [t.error for t in load_trajectories(run_dir / "trajectories.jsonl") if t.failed]
        first = one_line(errors[0] or "", 300) if errors else "see the report"
        result.failures.append(f"{run}: {summary['n_failed']} of {summary['n'] + summary['n_failed']} episodes "
                               f"failed ({first})")
        if summary["n"] == 0:  # nothing ran (e.g. DocRead on tasks without documents): not a result
            raise BadInput(f"{run}: no episode ran ({summary['n_failed']} failed: {first}); the report in "
                           f"{run_dir} lists every error")


def _run_names(specs: list[str]) -> dict[str, str]:
    """A directory name per policy: its last path part (`oracle`, `hf`), widened with the parent folder's
    name where two policies would share one (`sft_hf`, `train_hf`)."""
    clean = lambda s: re.sub(r"[^A-Za-z0-9_.-]+", "_", s)  # noqa: E731
    short = {s: clean(Path(s).name) for s in specs}
    taken = list(short.values())
    return {s: clean(f"{Path(s).parent.name}_{Path(s).name}") if taken.count(n) > 1 else n for s, n in short.items()}
