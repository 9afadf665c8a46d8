"""The viewer's HTTP app (FastAPI): the JSON endpoints of view/API.md over the opened runs, and the
page (view/static) at /. Runs are indexed by a background thread, so the first page answers before a large
file is indexed whole; a live run's new episodes are indexed as they are written."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, JSONResponse, Response

from sleuth.view import episode as ep
from sleuth.view.runs import Run, clean

STATIC = Path(__file__).resolve().parent / "static"
SORTS = ("index", "score", "-score", "turns", "-turns", "tokens", "-tokens", "task")
MEDIA = {".png": "image/png", ".jpg": "image/jpeg", ".md": "text/plain; charset=utf-8",
         ".txt": "text/plain; charset=utf-8"}


class Indexer(threading.Thread):
    """Indexes every run slice by slice, then keeps looking for what live runs append."""

    def __init__(self, runs: list[Run], idle_s: float = 1.0) -> None:
        super().__init__(daemon=True, name="sleuth-view-indexer")
        self.runs, self.idle_s, self.stopped = runs, idle_s, threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            busy = False
            for r in self.runs:
                before = len(r.index), r.index.torn
                r.update()
                busy = busy or (len(r.index), r.index.torn) != before or not r.complete()
                time.sleep(0.001)  # a request waiting for the scan lock takes it now
            if not busy:
                self.stopped.wait(self.idle_s)


def episodes(run: Run, offset: int, limit: int | None, q: str = "", sort: str = "index", status: str = "all",
             stop: str = "") -> dict[str, Any]:
    """A page of the episode list, from the index (filters over what is indexed so far; `complete` says
    whether that is the whole run)."""
    run.update(need=offset + (limit or 0) if not (q or stop or status != "all" or sort != "index") else 0)
    idx = run.index
    with idx.lock:
        n = len(idx)
        keep = range(n)
        if status != "all":
            keep = [i for i in keep if (i in idx.errors) == (status == "failed")]
        if stop:
            code = idx.stop_names.index(stop) if stop in idx.stop_names else -1
            keep = [i for i in keep if idx.stop[i] == code]
        if q:
            found = idx.matches(q)
            keep = [i for i in keep if i in found]
        keep = _sorted(idx, list(keep) if sort != "index" else keep, sort)
        total = len(keep)
        page = keep[offset:] if limit is None else keep[offset:offset + limit]
        rows = [idx.row(i) for i in page]
        stops: dict[str, int] = {}
        for code in idx.stop:
            stops[idx.stop_names[code]] = stops.get(idx.stop_names[code], 0) + 1
    return clean({"total": total, "offset": offset, "limit": limit if limit is not None else "all", "rows": rows,
                  "stop_reasons": stops, "complete": run.complete(), "torn": idx.torn})


def _sorted(idx: Any, keep: Any, sort: str) -> Any:
    if sort == "index":
        return keep
    key, desc = sort.lstrip("-"), sort.startswith("-")
    if key == "task":
        return sorted(keep, key=lambda i: idx.task_id[i])
    col = {"score": idx.score, "turns": idx.turns, "tokens": idx.tokens}[key]
    if key == "score":  # unscored episodes last, either way
        scored = [i for i in keep if col[i] == col[i]]
        return sorted(scored, key=lambda i: col[i], reverse=desc) + [i for i in keep if col[i] != col[i]]
    return sorted(keep, key=lambda i: col[i], reverse=desc)


def run_page(run: Run) -> dict[str, Any]:
    run.update()
    metrics = run.metrics()
    names = sorted({k for row in metrics for k, v in row.items() if isinstance(v, int | float)
                    and not isinstance(v, bool)})
    return {**run.brief(), "meta": run.meta(), "summary": run.summary(), "metrics": metrics, "metric_names": names,
            "reports": run.reports(), "episodes": len(run.index), "live": run.live(), "stage_times": run.stage_times()}


def create_app(runs: list[Run], index_in_background: bool = True) -> FastAPI:
    """The app over `runs` (ids "0", "1", ... as given)."""
    app = FastAPI(title="sleuth view", docs_url=None, redoc_url=None, openapi_url=None)
    by_id = {r.id: r for r in runs}
    if index_in_background:
        indexer = Indexer(runs)
        app.router.on_startup.append(indexer.start)
        app.router.on_shutdown.append(indexer.stopped.set)

    def get(r: str) -> Run:
        if r not in by_id:
            raise HTTPException(404, f"no run {r!r} (runs: {', '.join(by_id)})")
        return by_id[r]

    @app.exception_handler(HTTPException)
    async def _error(request: Request, e: HTTPException) -> JSONResponse:
        return JSONResponse({"error": str(e.detail)}, status_code=e.status_code)

    @app.get("/api/runs")
    def api_runs() -> dict[str, Any]:
        return {"runs": [r.brief() for r in runs]}

    @app.get("/api/run/{r}")
    def api_run(r: str) -> dict[str, Any]:
        return run_page(get(r))

    @app.get("/api/run/{r}/file/{name}")
    def api_file(r: str, name: str) -> Response:
        run = get(r)
        if name not in run.reports():
            raise HTTPException(404, f"no report file {name!r} in run {run.name}")
        path = run.path / name
        return FileResponse(path, media_type=MEDIA.get(path.suffix, "text/plain; charset=utf-8"))

    @app.get("/api/run/{r}/episodes")
    def api_episodes(r: str, offset: int = 0, limit: str = "50", q: str = "", sort: str = "index",
                     status: str = "all", stop: str = "") -> dict[str, Any]:
        if sort not in SORTS:
            raise HTTPException(400, f"sort must be one of {', '.join(SORTS)}, not {sort!r}")
        if status not in ("all", "ok", "failed"):
            raise HTTPException(400, f"status must be all, ok or failed, not {status!r}")
        if limit != "all" and not (limit.isdigit() and int(limit) > 0):
            raise HTTPException(400, f"limit must be a positive number or 'all', not {limit!r}")
        return episodes(get(r), max(offset, 0), None if limit == "all" else int(limit), q, sort, status, stop)

    @app.get("/api/run/{r}/episode/{i}")
    def api_episode(r: str, i: int) -> dict[str, Any]:
        run = get(r)
        run.update(need=i + 1)
        if not 0 <= i < len(run.index):
            raise HTTPException(404, f"no episode {i} in run {run.name} ({len(run.index)} indexed)")
        return ep.episode(run, i)

    @app.get("/api/run/{r}/group/{group}")
    def api_group(r: str, group: str, step: int | None = None) -> dict[str, Any]:
        run = get(r)
        out = ep.group(run, group, step)
        if not out["members"]:
            raise HTTPException(404, f"no group {group!r}" + (f" at step {step}" if step is not None else ""))
        return out

    @app.get("/api/compare")
    def api_compare(a: str, b: str, filter: str = "all") -> dict[str, Any]:
        if filter not in ("all", "better", "worse", "both_failed"):
            raise HTTPException(400, f"filter must be all, better, worse or both_failed, not {filter!r}")
        ra, rb = get(a), get(b)
        for run in (ra, rb):
            run.update(need=1 << 62)
        return ep.compare(ra, rb, filter)

    @app.get("/")
    def index() -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8")

    @app.get("/{name}")
    def static(name: str) -> Response:
        path = STATIC / name
        if name.startswith(".") or not path.is_file():
            raise HTTPException(404, f"no file {name!r}")
        return FileResponse(path)

    app.state.started = time.time()
    return app
