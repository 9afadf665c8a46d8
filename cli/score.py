"""`sleuth score` and `sleuth adapters`: verifiers on files, and where the trainer adapters are."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sleuth.cli.args import command
from sleuth.cli.args import fail as _fail
from sleuth.core.args import bounded


def cmd_score(args: argparse.Namespace) -> int:
    from sleuth.verifiers.base import CannotScore
    from sleuth.verifiers.batch import score_file

    if not Path(args.input).is_file():
        return _fail(f"input file not found: {args.input}")
    try:
        summary = score_file(args.verifier, args.input, args.out, args.workers, extract=not args.no_extract)
    except (ValueError, CannotScore) as e:  # a bad name or judge file; a group judge, which needs groups
        return _fail(str(e))
    print(json.dumps(summary, indent=2))
    return 0


def cmd_adapters(args: argparse.Namespace) -> int:
    """Where the trainer adapters are: verl and OpenRLHF take a file path, which an editable install does
    not put under site-packages."""
    import sleuth.verifiers.adapters as adapters

    files = {name: Path(adapters.__file__).parent / f"{name}.py" for name in ("trl", "verl", "openrlhf")}
    if args.path:
        print(files[args.path])
    else:
        for name, path in files.items():
            print(f"{name:9s} {path}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from sleuth.verifiers.registry import verifier_names

    verifiers = verifier_names()  # plugins' included
    s = command(sub, "score", cmd_score, "score JSONL records (data-set layout + a 'response' field) with a verifier",
                example="sleuth score --verifier qa --input answers.jsonl --out scored.jsonl")
    s.add_argument("--verifier", required=True, help=f"a verifier: {verifiers}")
    s.add_argument("--input", required=True, help="JSONL records in their data set's layout, each with a 'response'")
    s.add_argument("--out", required=True, help="JSONL: each record with 'score' and 'details' (never the input file)")
    s.add_argument("--workers", type=bounded(int, 1), default=2,
                   help="records scored in parallel (code, swe: sandbox runs)")
    s.add_argument("--no-extract", action="store_true",
                   help="score the response as it is "
                        "(default: the answer / program / patch in it, as every entry point does)")
    ad = command(sub, "adapters", cmd_adapters, "where the TRL / verl / OpenRLHF verifier adapters are (file paths)",
                example="sleuth adapters --path trl")
    ad.add_argument("--path", choices=["trl", "verl", "openrlhf"], help="print only this adapter's file")
