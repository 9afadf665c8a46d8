"""bench/gateway.py's overhead section: the gateway in front of a policy that answers at once
(`gateway_instant`), measured through the openai SDK, raw httpx and without HTTP, in a process of its own and
in this one."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gateway_agent import INSTANT_MAX_TOKENS, TOOLS
from gateway_instant import (
    REPLY,
    Call,
    InstantGateway,
    conversation,
    direct_session,
    httpx_session,
    instant_gateway,
    policy_session,
    sdk_session,
)


# -- section overhead: the gateway in front of an instant policy ---------------------------------------------
def _ms(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return 1000 * xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def cpu_seconds(pid: int | None) -> float:
    """CPU time (user + system) of process `pid` so far (this process if None); NaN where /proc is missing."""
    if pid is None:
        return time.process_time()
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load(sessions: int, threads: int, calls: int, task: Any, make: Callable[[int], Call],
         cpu_pid: int | None = None) -> dict[str, Any]:
    """`sessions` sessions of `calls` calls from `threads` threads (`threads` sessions at once; a thread's next
    session starts when its last ends), each session's client made before the clock starts: calls/s, p50/p99 ms
    per call seen by the client, CPU ms per call of process `cpu_pid` (default: this one), and under "took" each
    session's call times (seconds, in order)."""
    barrier = threading.Barrier(threads + 1)
    took: dict[int, list[float]] = {}
    errors: list[BaseException] = []

    def worker(w: int) -> None:
        try:
            clients = [(i, make(i)) for i in range(w, sessions, threads)]
        except BaseException as e:
            errors.append(e)
            barrier.abort()
            return
        try:
            barrier.wait()
            for i, call in clients:
                took[i] = conversation(call, task, calls)
        except BaseException as e:
            errors.append(e)

    workers = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(threads)]
    for t in workers:
        t.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    cpu0, start = cpu_seconds(cpu_pid), time.perf_counter()
    for t in workers:
        t.join()
    wall, cpu = time.perf_counter() - start, cpu_seconds(cpu_pid) - cpu0
    if errors:
        raise RuntimeError(f"{len(errors)} session(s) failed; the first: {type(errors[0]).__name__}: {errors[0]}")
    lat = [x for t in took.values() for x in t]
    return {"calls": len(lat), "cps": len(lat) / wall, "p50": _ms(lat, 0.5), "p99": _ms(lat, 0.99),
            "cpu_ms": 1000 * cpu / len(lat), "took": took}


@contextmanager
def own_process_gateway() -> Iterator[tuple[str, int]]:
    """The instant gateway served by a child process of this bench: (url, pid)."""
    from sleuth.core.net import free_port, wait_healthy

    port = free_port()
    script = str(Path(__file__).with_name("gateway.py"))
    proc = subprocess.Popen([sys.executable, script, "--serve-instant", str(port)], stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout_s=120, proc=proc)
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _end_sessions(url: str, names: list[str]) -> int:
    """Close the sessions over HTTP; the number of segments beyond one per session (should be 0)."""
    import httpx

    with httpx.Client(timeout=60) as client:
        return sum(client.delete(f"{url}/s/{n}").json()["segments"] - 1 for n in names)


def overhead_section(args: argparse.Namespace, task: Any) -> list[str]:
    import httpx

    from sleuth.core.net import in_thread

    n, k, engine_ms = args.sessions, args.calls, args.engine_ms
    rows: list[tuple[str, str, dict[str, Any]]] = []
    extra_segments = 0

    def http_rows(url: str, pid: int | None, where: str, control: Callable[[str], dict[str, Any]]) -> None:
        nonlocal extra_segments
        load(4, 4, 2, task, lambda i: httpx_session(f"{url}/s/warm-{i}-{uuid.uuid4().hex[:6]}/v1"), pid)
        for client, make in (("openai SDK", sdk_session), ("raw httpx", httpx_session)):
            for threads, delay in ((n, 0), (1, 0), (n, engine_ms)):
                control(f"/bench/engine-ms/{delay}")
                names = [f"{client.split()[-1]}-{threads}-{delay}-{i}-{uuid.uuid4().hex[:6]}" for i in range(n)]
                control("/bench/times")
                r = load(n, threads, k, task, lambda i, names=names, make=make: make(f"{url}/s/{names[i]}/v1"), pid)
                times = control("/bench/times")
                # the gateway's own part of a call: its latency less its time in the engine (waiting, generating)
                overhead = [lat - eng for i, name in enumerate(names)
                            for lat, eng in zip(r["took"][i], times["engine"][name], strict=True)]
                r.update(server_p50=_ms(times["server"], 0.5), server_p99=_ms(times["server"], 0.99),
                         over_p50=_ms(overhead, 0.5), over_p99=_ms(overhead, 0.99), batch=times["batch"])
                extra_segments += _end_sessions(url, names)
                at_once = f"{n} sessions at once" if threads > 1 else f"{n} sessions one at a time"
                rows.append((f"{client} → gateway {where}, {at_once}", f"{delay:g} ms", r))
                print(f"  {rows[-1][0]}, engine {delay} ms: p50 {r['p50']:.2f} ms, overhead p50 {r['over_p50']:.2f} "
                      f"ms, {r['cps']:.0f} calls/s", file=sys.stderr, flush=True)
        control("/bench/engine-ms/0")

    print("… gateway in a process of its own", file=sys.stderr, flush=True)
    with own_process_gateway() as (url, pid), httpx.Client(timeout=60) as http:
        http_rows(url, pid, "(own process)", lambda path: http.get(f"{url}{path}").json())
    print("… gateway in this process", file=sys.stderr, flush=True)
    inst = InstantGateway()

    def control(path: str) -> dict[str, Any]:
        if path.startswith("/bench/engine-ms/"):
            inst.policy.delay_s = float(path.rsplit("/", 1)[1]) / 1000
        return inst.take() if path == "/bench/times" else {}

    try:
        with in_thread(inst) as url:
            http_rows(url, None, "(this process, as `sleuth eval --agent`)", control)
        names = [f"direct-{i}" for i in range(n)]
        r = load(n, n, k, task, lambda i: direct_session(inst.gw, names[i]))
        ended = [inst.gw.end(s).segments for s in names]
        extra_segments += sum(len(segments) - 1 for segments in ended)
        context = len(ended[0][-1].token_ids())
        rows.append((f"`Gateway.complete`, no HTTP (the gateway's floor), {n} sessions at once", "0 ms", r))
        r = load(n, n, k, task, lambda i: policy_session(inst.policy))
        rows.append((f"the instant policy's `generate` alone (the floor), {n} threads", "0 ms", r))
    finally:
        inst.gw.close()
    out = [f"{n} sessions of {k} calls each, all at once and one at a time (unloaded); each call sends the whole "
           "DocRead-like conversation so far (system prompt, question and titles, every reply and document read: "
           f"{context} tokens by the end) with the two tools; the policy answers with `{REPLY!r}` (max_tokens "
           f"{INSTANT_MAX_TOKENS}) at once, or {engine_ms:g} ms after each call starts (a paced engine: what "
           "queues meanwhile is the next call's batch). **Client**: a call's latency seen by the agent's client. "
           "**Server**: from the request reaching the gateway's app to its answer's last byte handed to uvicorn. "
           "**Overhead**: the client's latency less the call's time in the engine (`Gateway._generate`: waiting "
           "for the engine, then its call): the gateway's own cost per call, HTTP and the client included, "
           "generation excluded. **CPU**: the gateway process's CPU time per call where the gateway has a process "
           "of its own, else this whole process's (clients included). **Requests per engine call**: how many "
           "sessions' calls the gateway batched into one `generate` (all of them, ideally, with a paced engine).",
           "",
           "| client → server | engine per call | calls | calls/s | client p50 ms | client p99 ms | server p50 ms | "
           "server p99 ms | overhead p50 ms | overhead p99 ms | CPU ms/call | requests per engine call |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, engine, r in rows:
        timed = (f"{r['server_p50']:.3f} | {r['server_p99']:.3f} | {r['over_p50']:.3f} | {r['over_p99']:.3f}"
                 if "server_p50" in r else "– | – | – | –")
        batch = f"{r['batch']:.1f}" if "batch" in r else "–"
        out.append(f"| {name} | {engine} | {r['calls']} | {r['cps']:.0f} | {r['p50']:.3f} | {r['p99']:.3f} | "
                   f"{timed} | {r['cpu_ms']:.3f} | {batch} |")
    out += ["", f"Every session recorded as one segment (no split): {'yes' if extra_segments == 0 else 'NO'}"
            f"{'' if extra_segments == 0 else f' ({extra_segments} extra segments)'}.", ""]
    return out + breakdown(task, k)


# -- where one call's time goes ----------------------------------------------------------------------------------
@contextmanager
def stage_timers(spent: dict[str, float]) -> Iterator[None]:
    """Time the gateway's parts of a call (seconds summed into `spent`) by wrapping them for the duration."""
    from sleuth.agents.chat import ChatRenderer
    from sleuth.agents.gateway import recorder, render, server

    targets = [(recorder, "normalise", "normalise"), (recorder.Gateway, "complete", "complete"),
               (recorder.Gateway, "_extension", "extension"), (ChatRenderer, "observation_ids", "render_new"),
               (recorder.Gateway, "_generate", "engine"), (render.ChatFormat, "reply", "reply"),
               (server, "completion_body", "body")]
    originals = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in targets]

    def timed(fn: Callable[..., Any], key: str) -> Callable[..., Any]:
        def wrapper(*a: Any, **kw: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[key] = spent.get(key, 0.0) + time.perf_counter() - start

        return wrapper

    for (obj, attr, key), (_, _, fn) in zip(targets, originals, strict=True):
        setattr(obj, attr, timed(fn, key))
    try:
        yield
    finally:
        for obj, attr, fn in originals:
            setattr(obj, attr, fn)


def breakdown(task: Any, calls: int, sessions: int = 20) -> list[str]:
    """Mean µs per call of each part, one session at a time (no load), over `sessions` sessions of `calls` calls:
    stage timers around the gateway's parts in process, then the same sessions over HTTP with httpx and with the
    SDK (gateway in this process): the HTTP and SDK parts are differences of mean latencies."""
    from sleuth.agents.gateway import create_app, server
    from sleuth.core.net import in_thread

    gw = instant_gateway()
    spent: dict[str, float] = {}
    latency: dict[str, list[float]] = {"direct": [], "httpx": [], "sdk": []}
    try:
        with in_thread(create_app(gw)) as url:
            conversation(httpx_session(f"{url}/s/warm/v1"), task, 2)
            for s in range(sessions):
                latency["direct"] += conversation(direct_session(gw, f"d{s}"), task, calls)
                latency["httpx"] += conversation(httpx_session(f"{url}/s/h{s}/v1"), task, calls)
                latency["sdk"] += conversation(sdk_session(f"{url}/s/o{s}/v1"), task, calls)
        done = gw.complete("body", [{"role": "user", "content": "x"}], TOOLS, None)
        with stage_timers(spent):
            for s in range(sessions):
                conversation(direct_session(gw, f"t{s}"), task, calls)
            for _ in range(sessions * calls):  # only the server calls it: timed on its own
                server.completion_body(gw, done, "policy", False)
    finally:
        gw.close()
    us = {key: 1e6 * v / (sessions * calls) for key, v in spent.items()}
    direct, via_httpx, via_sdk = (1e6 * statistics.mean(latency[k]) for k in ("direct", "httpx", "sdk"))
    parts = [("normalise the request's messages and the reply (`normalise`)", us["normalise"]),
             ("does it extend the last call? (`_extension`, less the rendering below)",
              us["extension"] - us["render_new"]),
             ("render + tokenise the new messages (`ChatRenderer.observation_ids`)", us["render_new"]),
             ("engine round trip: RequestQueue, its thread, the instant policy (`_generate`)", us["engine"]),
             ("the reply as OpenAI tool_calls (`ChatFormat.reply`)", us["reply"])]
    parts.append(("the rest of `Gateway.complete` (locks, json.dumps of the tools, bookkeeping)",
                  us["complete"] - sum(v for _, v in parts)))
    parts.append(("the response body (`completion_body`)", us["body"]))
    parts.append(("HTTP, server and client: uvicorn (h11), FastAPI (body parse + validation, thread hop, response "
                  "encoding), httpx", via_httpx - direct - us["body"]))
    parts.append(("the openai SDK's own client cost (SDK call − httpx call)", via_sdk - via_httpx))
    out = [f"Where one call's time goes, unloaded: 1 session at a time, {sessions} sessions × {calls} calls, mean "
           "µs per call:", "", "| part | µs/call |", "|---|---|"]
    out += [f"| {name} | {v:.0f} |" for name, v in parts]
    out += [f"| **total: `Gateway.complete` in process (untimed run)** | {direct:.0f} |",
            f"| **total: a call through httpx** | {via_httpx:.0f} |",
            f"| **total: a call through the openai SDK** | {via_sdk:.0f} |"]
    return out
