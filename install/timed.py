"""Run one stage of a Makefile job and append how long it took to a JSONL log, so the job's summary can say what
each stage cost (`make run` → runs/main/stages.jsonl → `sleuth summary`). The stage's exit status passes through.
Stdlib only: it runs before and beside the venv's own tools.

Usage: python install/timed.py LOG STAGE -- COMMAND [ARG ...]
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: timed.py LOG STAGE -- COMMAND [ARG ...]", file=sys.stderr)
        return 2
    log, stage, command = Path(argv[0]), argv[1], argv[3:]
    start = time.monotonic()
    rc = subprocess.call(command)
    record = {"stage": stage, "seconds": round(time.monotonic() - start, 1), "rc": rc,
              "ended": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
