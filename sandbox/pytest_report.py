"""A pytest plugin that the sandbox loads into test runs (`-p sleuth_pytest_report`): one JSON line per
test phase and per collection error, appended to the file named by $SLEUTH_PYTEST_REPORT as it happens,
so a run killed at its deadline still reports what finished. It imports nothing from sleuth: it runs
inside the repository's own environment.

The variable is removed from the environment at start-up, before any code under test is imported; code
under test runs in the same process and could still forge lines, as in every harness that reads results
from the process it tests (SWE-bench reads its logs the same way)."""

import json
import os

_PATH = os.environ.pop("SLEUTH_PYTEST_REPORT", None)
_OUT = open(_PATH, "a", encoding="utf-8") if _PATH else None  # noqa: SIM115 (open for the whole run)


def _emit(rec):
    if _OUT is not None:
        _OUT.write(json.dumps(rec) + "\n")
        _OUT.flush()


def _frames(longrepr):
    """(path, line, source lines) of each traceback entry, for a readable failure summary."""
    tb = getattr(longrepr, "reprtraceback", None)
    out = []
    for entry in getattr(tb, "reprentries", None) or []:
        loc = getattr(entry, "reprfileloc", None)
        lines = [str(x) for x in (getattr(entry, "lines", None) or [])][-12:]
        out.append({"path": getattr(loc, "path", ""), "lineno": getattr(loc, "lineno", 0),
                    "where": getattr(loc, "message", ""), "lines": lines})
    return out


def pytest_runtest_logreport(report):
    rec = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
           "xfail": bool(getattr(report, "wasxfail", False)), "duration": round(report.duration, 4)}
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        rec["message"] = str(getattr(crash, "message", "") or "")[:2000] or str(report.longrepr)[-2000:]
        rec["frames"] = _frames(report.longrepr)
    _emit(rec)


def pytest_collectreport(report):
    if report.failed:
        _emit({"collect_error": report.nodeid or ".", "message": str(report.longrepr)[-3000:]})


def pytest_unconfigure(config):
    if _OUT is not None and not _OUT.closed:
        _OUT.close()
