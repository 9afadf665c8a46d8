"""`sleuth view RUN [RUN ...]`: the trajectory and run viewer in the browser, or a self-contained HTML export."""

from __future__ import annotations

import argparse
import threading
import webbrowser

from sleuth.cli.args import command
from sleuth.cli.args import fail as _fail
from sleuth.core.args import bounded


def cmd_view(args: argparse.Namespace) -> int:
    from sleuth.view.runs import RunError, open_runs

    try:
        runs = open_runs(args.runs)
    except RunError as e:
        return _fail(str(e))
    if args.html:
        from sleuth.view.export import export

        path = export(runs, args.html)
        print(f"wrote {path} ({len(runs)} run{'s' * (len(runs) != 1)}): open it in a browser, no server needed")
        return 0
    import uvicorn

    from sleuth.view.server import create_app

    url = f"http://{args.host}:{args.port}/"
    for r in runs:
        print(f"run {r.id}: {r.name} ({r.kind}) {r.path}")
    print(f"sleuth view: {url} (Ctrl-C stops it)", flush=True)
    if not args.no_open:
        threading.Timer(1.0, webbrowser.open, (url,)).start()
    uvicorn.run(create_app(runs), host=args.host, port=args.port, log_level="warning")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    v = command(sub, "view", cmd_view, "look at runs in the browser: episodes token by token, credit, groups, compare",
                example="sleuth view runs/main/smollm2-text runs/main/trained-text --port 8765")
    v.add_argument("runs", nargs="+", metavar="RUN", help="run directories (sleuth eval/train/sft, runs/main)")
    v.add_argument("--port", type=bounded(int, 1), default=8765)
    v.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1: this machine only)")
    v.add_argument("--html", metavar="FILE", help="write one self-contained HTML file instead of serving")
    v.add_argument("--no-open", action="store_true", help="do not open a browser")
