"""Running agents sleuth has never seen: a user's function `run(task: dict, base_url: str) -> str` (sync or
`async def`), written against any OpenAI-compatible client, pointed at the gateway with a session of its own;
or a program in any language (`CommandAgent`): the task's JSON on its stdin, the answer on its stdout.

Each episode calls the function with the task less its gold (`public_task`), records every call it makes
through the gateway as token-exact segments, and scores the string it returns with a registered verifier.
An episode that cannot give an answer (the agent raised, the gateway or the verifier failed) is one failed
trajectory, never scored, retried by a resumed eval, as env episodes are."""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import inspect
import json
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from sleuth.agents.gateway import Gateway
from sleuth.agents.gateway.reads import recognise_reads
from sleuth.agents.gateway.recorder import ENV_ID
from sleuth.agents.trajectory import Trajectory
from sleuth.core.errors import BadInput, InfraFailure
from sleuth.tasks.base import Task
from sleuth.tasks.registry import label_fields
from sleuth.verifiers.registry import get_verifier, verdict

# The protocol: the public task and the OpenAI base URL of the episode's session; the final answer back.
AgentFn = Callable[[dict[str, Any], str], "str | Awaitable[str]"]


class AgentLoadError(BadInput):
    """The agent cannot be loaded: its module or function is missing, or the function cannot take
    `(task, base_url)`. One line, said before any model loads."""


def load_agent(entrypoint: str, path: str | None = None) -> AgentFn:
    """The function named `module:function` (a dotted attribute path after the colon is followed), imported
    with `path` (a directory) first on `sys.path`."""
    module_name, _, attr = entrypoint.partition(":")
    if not module_name or not attr or not all(p.isidentifier() for p in [*module_name.split("."), *attr.split(".")]):
        raise AgentLoadError(f"an agent is named module:function (e.g. my_agent:run), got {entrypoint!r}")
    if path is not None:
        where = Path(path).resolve()
        if not where.is_dir():
            raise AgentLoadError(f"--agent-path {path} is not a directory")
        if str(where) not in sys.path:
            sys.path.insert(0, str(where))
    searched = f" in {path} or on sys.path" if path else " on sys.path (add --agent-path DIR)"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):  # the agent's own module, not one it imports
            raise AgentLoadError(f"no module {module_name!r}{searched}") from None
        raise AgentLoadError(f"importing {module_name!r} failed: {type(e).__name__}: {e}") from None
    except Exception as e:  # the agent's module raised at import: its own line, not sleuth's traceback
        raise AgentLoadError(f"importing {module_name!r} failed: {type(e).__name__}: {_where(e)}") from None
    fn: Any = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            defined = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                             and getattr(v, "__module__", None) == module.__name__)
            raise AgentLoadError(f"{module_name} ({getattr(module, '__file__', '?')}) has no {attr!r}; it defines: "
                                 f"{', '.join(defined) or 'no functions'}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise AgentLoadError(f"{entrypoint} is a {type(fn).__name__}, not a function run(task, base_url)")
    try:  # a check that fails before the model loads, not the protocol (which is AgentFn)
        inspect.signature(fn).bind({}, "")
    except TypeError:
        raise AgentLoadError(f"{entrypoint}{inspect.signature(fn)} cannot be called as run(task, base_url)") from None
    except ValueError:  # a callable without a readable signature: the first call says it
        pass
    return fn


class AgentCommandError(InfraFailure):
    """A command agent's episode gave no answer: the program exited non-zero, or ran past its timeout."""


class CommandAgent:
    """An agent in any language, as an `AgentFn`: each call runs `command` (split as a shell would, run without
    one) in `cwd` with the public task's JSON on its stdin and `OPENAI_BASE_URL` (the episode's session) and
    `OPENAI_API_KEY` in its environment; its stdout, stripped, is the answer. A non-zero exit or a run past
    `timeout_s` (its whole process group is killed) raises `AgentCommandError` with the last line of its
    stderr, which fails the episode."""

    def __init__(self, command: str, cwd: str | Path | None = None, timeout_s: float = 600.0,
                 api_key: str = "sleuth-local"):
        self.command, self.timeout_s, self.api_key = command, timeout_s, api_key
        self.cwd = Path(cwd or ".").resolve()
        try:
            self.argv = shlex.split(command)
        except ValueError as e:  # an unclosed quote
            raise AgentLoadError(f"agent command {command!r}: {e}") from None
        if not self.argv:
            raise AgentLoadError("the agent command is empty")
        if not self.cwd.is_dir():
            raise AgentLoadError(f"the agent's directory {cwd} is not a directory")
        if timeout_s <= 0:
            raise AgentLoadError(f"the agent's timeout must be > 0 s, got {timeout_s}")
        exe = self.argv[0]
        found = (self.cwd / exe).is_file() if os.sep in exe else shutil.which(exe) is not None
        if not found:  # before any model loads, not once per episode
            raise AgentLoadError(f"agent command {command!r}: {exe!r} is not "
                                 f"{f'a file in {self.cwd}' if os.sep in exe else 'on PATH'}")

    def __call__(self, task: dict[str, Any], base_url: str) -> str:
        env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": self.api_key}
        proc = subprocess.Popen(self.argv, cwd=self.cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)  # its own group, killed whole
        try:
            out, err = proc.communicate(json.dumps(task, ensure_ascii=False).encode(), timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            _kill(proc)
            _, err = proc.communicate()
            raise AgentCommandError(f"{self.command} ran past its timeout of {self.timeout_s:g} s"
                                    f"{_last_line(err)}") from None
        finally:
            if proc.poll() is None:  # an error of ours while it ran: the program does not outlive its episode
                _kill(proc)
                proc.wait()
        if proc.returncode != 0:
            raise AgentCommandError(f"{self.command} exited with {proc.returncode}{_last_line(err)}")
        return out.decode("utf-8", errors="replace").strip()

    def files(self) -> list[Path]:
        """The files of `cwd` that the command names (its script, its binary): what the run's identity hashes."""
        return [self.cwd / a for a in self.argv if (self.cwd / a).is_file()]


def _kill(proc: subprocess.Popen) -> None:
    """Kill the program and whatever it started (its process group, which `start_new_session` made)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # already gone
        pass


def _last_line(stderr: bytes) -> str:
    lines = [x.strip() for x in stderr.decode("utf-8", errors="replace").splitlines() if x.strip()]
    return f": {lines[-1][:500]}" if lines else " (nothing on stderr)"


def agent_identity(entrypoint: str, agent: AgentFn) -> dict[str, Any]:
    """The agent as a run's identity sees it: its entry point and a hash of the file that defines it (an edited
    agent is another run, the same file elsewhere is not; the modules it imports are not hashed). A command's
    hash is over the files it names in its directory."""
    if isinstance(agent, CommandAgent):
        files = agent.files()
        digest = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:16] if files else None
        return {"agent": entrypoint, "agent_source": digest}
    try:
        source = inspect.getsourcefile(agent)
    except TypeError:  # defined outside any file (a builtin, a C extension)
        source = None
    digest = hashlib.sha256(Path(source).read_bytes()).hexdigest()[:16] if source else None
    return {"agent": entrypoint, "agent_source": digest}


def public_task(task: Task) -> dict[str, Any]:
    """The task as its agent sees it: a deep copy without the answer, the aliases and the payload's label fields
    (those its task source declares, `sleuth.tasks.registry.label_fields`)."""
    labels = set(label_fields(task.source))
    d = task.to_dict()  # a copy: an agent that edits its task changes nothing of the run's
    del d["answer"], d["aliases"]
    d["payload"] = {k: v for k, v in d["payload"].items() if k not in labels}
    return d


def run_agent_episodes(agent: AgentFn, tasks: Iterable[Task], gateway: Gateway, gateway_url: str, verifier: str,
                       concurrency: int, samples: int = 1, timeout_s: float | None = None) -> Iterator[Trajectory]:
    """Yield each episode's trajectories as soon as it ends (completion order; an episode's records together,
    in segment order). `concurrency` episodes run at once, each in a thread of its own (an `async def` agent
    in an event loop of its own there); sessions open in task order, so the gateway seeds them the same way
    every run. Every record of an episode carries its `episode` (the session), `segment` and `segments`
    (how many records the episode has), and in `meta` its `calls`, `splits` and `agent_answer`. An episode
    still running `timeout_s` after it began (a hung tool, an agent that never returns) is one failed record
    (`timeout`, never scored); its session is cancelled and its thread left behind (a daemon)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    get_verifier(verifier)  # an unknown name (or a group judge) fails here, before any episode runs
    work = ((t, k) for t in tasks for k in range(samples))
    finished: queue.SimpleQueue[tuple[str, list[Trajectory]]] = queue.SimpleQueue()
    running: dict[str, tuple[Task, float]] = {}  # session: its task and when it began
    while True:
        while len(running) < concurrency and (item := next(work, None)) is not None:
            task, k = item
            session = f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', task.id)}.{k}.{uuid.uuid4().hex[:8]}"
            gateway.begin(session, task)
            args = (agent, task, session, f"{gateway_url}/s/{session}/v1", gateway, verifier, finished)
            threading.Thread(target=_episode, args=args, daemon=True,  # a hung agent never blocks exit
                             name=f"sleuth-agent-{session}").start()
            running[session] = (task, time.monotonic())
        if not running:
            return
        first = min(t0 for _, t0 in running.values())
        try:
            session, records = finished.get(timeout=None if timeout_s is None
                                             else max(0.0, first + timeout_s - time.monotonic()))
        except queue.Empty:
            yield from _expire(running, gateway, timeout_s or 0.0)
            continue
        if running.pop(session, None) is not None:  # else given up on already: what it sends now is dropped
            yield from records


def _expire(running: dict[str, tuple[Task, float]], gateway: Gateway, timeout_s: float) -> Iterator[Trajectory]:
    """A failed record for each episode of `running` past its deadline, its session cancelled."""
    now = time.monotonic()
    for session, (task, t0) in list(running.items()):
        if now - t0 >= timeout_s:
            del running[session]
            why = f"the episode ran past rollout.episode_timeout_s ({timeout_s:g} s)"
            gateway.cancel(session, why)
            yield _failed(task, session, "timeout", why)


def _episode(agent: AgentFn, task: Task, session: str, base_url: str, gateway: Gateway, verifier: str,
             finished: queue.SimpleQueue[tuple[str, list[Trajectory]]]) -> None:
    """One episode, in its own thread; whatever happens, its records reach `finished`."""
    try:
        records = _records(agent, task, session, base_url, gateway, verifier)
    except BaseException as e:  # a fault of sleuth's own: still one failed record, so the run never waits
        records = [_failed(task, session, "gateway_error", f"{type(e).__name__}: {e}")]
    finished.put((session, records))


def _records(agent: AgentFn, task: Task, session: str, base_url: str, gateway: Gateway, verifier: str
             ) -> list[Trajectory]:
    try:
        answer = agent(public_task(task), base_url)
        if inspect.isawaitable(answer):
            answer = asyncio.run(_wait(answer))
    except (Exception, SystemExit) as e:
        gateway.end(session)  # what it recorded is no episode: dropped with its session
        where = str(e) if isinstance(e, AgentCommandError) else _where(e)  # a program's own line, not ours
        return [_failed(task, session, "agent_error", f"{type(e).__name__}: {where}")]
    ep = gateway.end(session)
    if ep.error is not None:  # the engine failed a call: whatever the agent answered after it, it is no answer
        return [_failed(task, session, "engine_error", f"{ep.failed_calls} call(s) failed; the last: {ep.error}")]
    if not isinstance(answer, str):
        return [_failed(task, session, "agent_error", f"the agent returned {type(answer).__name__}, not a string")]
    reads = recognise_reads(ep.segments, task)
    try:
        v = verdict(verifier, task, answer, **({"evidence": [r.title for r in reads]} if reads is not None else {}))
    except Exception as e:  # e.g. a verifier that cannot score on this machine: no verdict, so no answer
        return [_failed(task, session, "verifier_error", f"{verifier}: {type(e).__name__}: {e}")]
    segments = ep.segments or [Trajectory(task.id, ENV_ID, prompt_ids=[], terminated=True, stop_reason="no_calls")]
    for i, t in enumerate(segments):
        t.task_id, t.group = task.id, task.id
        t.reward, t.verdict, t.terminated = float(v.score), v, True
        t.episode, t.segment, t.segments = session, i, len(segments)
        t.meta.update(calls=ep.calls, splits=ep.splits, agent_answer=answer)
    return segments


async def _wait(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _failed(task: Task, session: str, reason: str, error: str) -> Trajectory:
    return Trajectory(task.id, ENV_ID, prompt_ids=[], stop_reason=reason, error=error, group=task.id,
                      episode=session)


def _where(e: BaseException) -> str:
    """An exception's message and the line of the agent's code that raised it: the innermost frame outside the
    standard library and installed packages (an SDK's error is raised deep inside the SDK), else the innermost."""
    frames = traceback.extract_tb(e.__traceback__)
    libraries = (sys.base_prefix, sys.prefix)
    own = [f for f in frames if not f.filename.startswith(libraries) and "-packages" not in f.filename]
    frame = (own or frames or [None])[-1]
    return f"{e} (at {Path(frame.filename).name}:{frame.lineno})" if frame else str(e)
