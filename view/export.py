"""`sleuth view RUN --html FILE`: one self-contained HTML file (the page's CSS and scripts inlined, the data in
`window.SLEUTH_DATA`), which opens from disk with no server and no network."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sleuth.view import episode as ep
from sleuth.view.runs import Run
from sleuth.view.server import STATIC, episodes, run_page

MAX_ROWS = 20000  # list rows per run in the file
MAX_EPISODES = 100  # episode pages per run in the file (the first ones of the list)
MAX_GROUPS = 50  # group pages per run


def collect(runs: list[Run], max_rows: int = MAX_ROWS, max_episodes: int = MAX_EPISODES) -> dict[str, Any]:
    """The responses the page needs, keyed by the request path it would fetch."""
    data: dict[str, Any] = {"/api/runs": {"runs": [r.brief() for r in runs]}}
    for run in runs:
        run.update(need=1 << 62)
        base = f"/api/run/{run.id}"
        data[base] = run_page(run)
        data[f"{base}/episodes?offset=0&limit=all"] = episodes(run, 0, max_rows)
        for i in range(min(len(run.index), max_episodes)):
            data[f"{base}/episode/{i}"] = ep.episode(run, i)
        groups: dict[tuple[str, int | None], None] = {}
        if run.kind == "train":
            for i in range(len(run.index)):
                groups.setdefault((run.index.group[i], run.index.step(i)), None)
                if len(groups) >= MAX_GROUPS:
                    break
        for name, step in groups:
            key = f"{base}/group/{quote(name, safe='')}" + (f"?step={step}" if step is not None else "")
            data[key] = ep.group(run, name, step)
        for name in run.reports():
            if name.endswith(".png"):
                raw = base64.b64encode((run.path / name).read_bytes()).decode()
                data[f"{base}/file/{name}"] = f"data:image/png;base64,{raw}"
            elif name.endswith((".md", ".txt")):
                data[f"{base}/file/{name}"] = (run.path / name).read_text(encoding="utf-8", errors="replace")
    evals = [r for r in runs if r.kind in ("eval", "agent")]
    for a in evals:
        for b in evals:
            if a is not b:
                data[f"/api/compare?a={a.id}&b={b.id}&filter=all"] = ep.compare(a, b, "all")
    return data


def script_json(data: Any) -> str:
    """JSON safe inside a <script> element: every `<` as \\u003c, so no text (`</script>`, `<!--`) can close
    the element or change how the browser reads it; U+2028/9 escaped for older JavaScript parsers."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def render(data: dict[str, Any], static: Path = STATIC) -> str:
    """index.html with each stylesheet and script it names inlined, and SLEUTH_DATA defined before them."""
    html = (static / "index.html").read_text(encoding="utf-8")

    def style(m: re.Match) -> str:
        css = (static / m.group(1)).read_text(encoding="utf-8").replace("</", "<\\/")
        return f"<style>\n{css}\n</style>"

    def script(m: re.Match) -> str:
        path = static / m.group(1)
        if not path.is_file():
            return ""
        js = path.read_text(encoding="utf-8").replace("</script", "<\\/script")
        return f"<script>\n{js}\n</script>"

    html = re.sub(r'<link rel="stylesheet" href="([^"/]+)">', style, html)
    first = html.find("<script")
    head = f"<script>window.SLEUTH_DATA = {script_json(data)};</script>\n"
    html = html[:first] + head + html[first:] if first >= 0 else html.replace("</body>", head + "</body>")
    return re.sub(r'<script src="([^"/]+)"></script>', script, html)


def export(runs: list[Run], out: str | Path) -> Path:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(collect(runs)), encoding="utf-8")
    return path
