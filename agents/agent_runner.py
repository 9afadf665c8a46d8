"""Running agents sleuth has never seen: a user's function `run(task: dict, base_url: str) -> str` (sync or
`async def`), written against any OpenAI-compatible client, pointed at the gateway with a session of its own.

Each episode calls the function with the task less its gold (`public_task`), records every call it makes
through the gateway as token-exact segments, and scores the string it returns with a registered verifier.
An episode that cannot give an answer (the agent raised, the gateway or the verifier failed) is one failed
trajectory, never scored, retried by a resumed eval, as env episodes are."""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import inspect
import queue
import re
import sys
import threading
import traceback
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from sleuth.agents.gateway import Gateway
from sleuth.agents.gateway.recorder import ENV_ID
from sleuth.agents.trajectory import Trajectory
from sleuth.tasks.base import Task
from sleuth.tasks.registry import label_fields
from sleuth.verifiers.registry import VERIFIERS, verdict

# The protocol: the public task and the OpenAI base URL of the episode's session; the final answer back.
AgentFn = Callable[[dict[str, Any], str], "str | Awaitable[str]"]


class AgentLoadError(ValueError):
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


def agent_identity(entrypoint: str, agent: AgentFn) -> dict[str, Any]:
    """The agent as a run's identity sees it: its entry point and a hash of the file that defines it (an edited
    agent is another run, the same file elsewhere is not; the modules it imports are not hashed)."""
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
                       concurrency: int, samples: int = 1) -> Iterator[Trajectory]:
    """Yield each episode's trajectories as soon as it ends (completion order; an episode's records together,
    in segment order). `concurrency` episodes run at once, each in a thread of its own (an `async def` agent
    in an event loop of its own there); sessions open in task order, so the gateway seeds them the same way
    every run. Every record of an episode carries its `episode` (the session), `segment` and `segments`
    (how many records the episode has), and in `meta` its `calls`, `splits` and `agent_answer`."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    VERIFIERS.get(verifier)  # an unknown name fails here, with the known ones, before any episode runs
    work = ((t, k) for t in tasks for k in range(samples))
    finished: queue.SimpleQueue[list[Trajectory]] = queue.SimpleQueue()
    running = 0
    while True:
        while running < concurrency and (item := next(work, None)) is not None:
            task, k = item
            session = f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', task.id)}.{k}.{uuid.uuid4().hex[:8]}"
            gateway.begin(session, task)
            args = (agent, task, session, f"{gateway_url}/s/{session}/v1", gateway, verifier, finished)
            threading.Thread(target=_episode, args=args, daemon=True,  # a hung agent never blocks exit
                             name=f"sleuth-agent-{session}").start()
            running += 1
        if running == 0:
            return
        records = finished.get()
        running -= 1
        yield from records


def _episode(agent: AgentFn, task: Task, session: str, base_url: str, gateway: Gateway, verifier: str,
             finished: queue.SimpleQueue[list[Trajectory]]) -> None:
    """One episode, in its own thread; whatever happens, its records reach `finished`."""
    try:
        records = _records(agent, task, session, base_url, gateway, verifier)
    except BaseException as e:  # a fault of sleuth's own: still one failed record, so the run never waits
        records = [_failed(task, session, "gateway_error", f"{type(e).__name__}: {e}")]
    finished.put(records)


def _records(agent: AgentFn, task: Task, session: str, base_url: str, gateway: Gateway, verifier: str
             ) -> list[Trajectory]:
    try:
        answer = agent(public_task(task), base_url)
        if inspect.isawaitable(answer):
            answer = asyncio.run(_wait(answer))
    except (Exception, SystemExit) as e:
        gateway.end(session)  # what it recorded is no episode: dropped with its session
        return [_failed(task, session, "agent_error", f"{type(e).__name__}: {_where(e)}")]
    ep = gateway.end(session)
    if ep.error is not None:  # the engine failed a call: whatever the agent answered after it, it is no answer
        return [_failed(task, session, "engine_error", f"{ep.failed_calls} call(s) failed; the last: {ep.error}")]
    if not isinstance(answer, str):
        return [_failed(task, session, "agent_error", f"the agent returned {type(answer).__name__}, not a string")]
    try:
        v = verdict(verifier, task, answer)
    except Exception as e:  # e.g. a verifier that cannot score on this machine: no verdict, so no answer
        return [_failed(task, session, "verifier_error", f"{verifier}: {type(e).__name__}: {e}")]
    segments = ep.segments or [Trajectory(task.id, ENV_ID, prompt_ids=[], terminated=True, stop_reason="no_calls")]
    for i, t in enumerate(segments):
        t.task_id, t.group = task.id, task.id
        t.reward, t.verdict, t.terminated = float(v.score), v.to_dict(), True
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
