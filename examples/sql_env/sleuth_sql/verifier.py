"""Execution accuracy (as Spider measures it): the predicted SQL is right when it returns the same rows
as the gold SQL — as a multiset, or in order when the gold query orders its result. Model-written SQL is
code: it runs inside sleuth's sandbox, on a copy of the database, with a time limit."""

from __future__ import annotations

import base64
import json
from typing import Any

from sleuth import Verdict
from sleuth.sandbox import Limits, Sandbox
from sleuth_sql.db import database

RUNNER = """
import json, sqlite3, sys
con = sqlite3.connect("file:db.sqlite?mode=ro", uri=True)
out = []
for sql in json.load(open("queries.json")):
    try:
        rows = con.execute(sql).fetchmany(1001)
        out.append({"rows": [list(r) for r in rows]})
    except Exception as e:
        out.append({"error": type(e).__name__ + ": " + str(e)})
print(json.dumps(out))
"""


def run_sql(sandbox: Sandbox, queries: list[str]) -> list[dict[str, Any]]:
    """Run queries read-only against a copy of the database inside the sandbox."""
    db = base64.b64encode(database().read_bytes()).decode()
    boot = f"import base64\nopen('db.sqlite', 'wb').write(base64.b64decode(open('db.b64').read()))\n{RUNNER}"
    res = sandbox.run_python(boot, {"db.b64": db, "queries.json": json.dumps(queries)})
    if not res.ok:
        return [{"error": f"the query run failed: {res.status}: {res.stderr[-300:]}"}] * len(queries)
    return json.loads(res.stdout)


class SqlVerifier:
    def __init__(self, sandbox: Sandbox | None = None):
        self.sandbox = sandbox or Sandbox(Limits(wall_s=10, output_bytes=1_000_000, file_mb=64))

    def __call__(self, task: Any, response: str, **_: Any) -> Verdict:
        gold_sql = task.answer if hasattr(task, "answer") else task["answer"]
        gold, pred = run_sql(self.sandbox, [gold_sql, response or "SELECT NULL WHERE 0"])
        if "error" in pred:
            return Verdict(0.0, {"error": pred["error"], "executed": False})
        ordered = "order by" in gold_sql.lower()
        same = (pred["rows"] == gold["rows"] if ordered
                else sorted(map(repr, pred["rows"])) == sorted(map(repr, gold["rows"])))
        return Verdict(float(same), {"executed": True, "rows": len(pred["rows"]), "gold_rows": len(gold["rows"])})
