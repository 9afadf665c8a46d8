"""One runnable example per `sleuth` subcommand, shown at the end of its `--help` (a test checks each has one)."""

from __future__ import annotations

import argparse

EXAMPLES = {
    "envs": "sleuth envs",
    "eval": "sleuth eval --env sleuth/DocRead-v0 --tasks hotpotqa:test --limit 20 --policy smollm2 --out runs/ev",
    "compare": "sleuth compare runs/ev/smollm2-text runs/ev-trained/smollm2-text --out runs/compare",
    "summary": "sleuth summary runs/main",
    "judge-check": "sleuth judge-check --judge judge.yaml --group-judge group.yaml --tasks hotpotqa:dev --limit 40",
    "view": "sleuth view runs/main/smollm2-text runs/main/trained-text --port 8765",
    "bfcl-table": "sleuth bfcl-table runs/bfcl/smollm2 runs/bfcl/trained --out runs/bfcl/compare",
    "score": "sleuth score --verifier qa --input answers.jsonl --out scored.jsonl",
    "adapters": "sleuth adapters --path trl",
    "index build": "sleuth index build --corpus $SLEUTH_DATA/corpora/2wikimultihopqa_passages.jsonl --out runs/ix",
    "search": "sleuth search --index runs/ix --queries queries.jsonl --out runs/ix.trec",
    "serve retrieval": "sleuth serve retrieval --index runs/ix --port 8000",
    "serve env": "sleuth serve env --env sleuth/DocRead-v0 --port 8002",
    "serve openenv": "sleuth serve openenv --env sleuth/DocRead-v0 --tasks hotpotqa:dev --port 8003",
    "serve verifier": "sleuth serve verifier --name qa --port 8001",
    "serve tinker": "sleuth serve tinker --port 8004 --state-dir runs/tinker",
    "serve gateway": "sleuth serve gateway --policy smollm2 --port 8003 --out runs/gateway",
    "tasks build-swe": "sleuth tasks build-swe --package toolz==1.2.0 --n 30 --out toolz.jsonl",
    "train": "sleuth train --config configs/docread_quick.yaml --out runs/quick --max-steps 5",
    "sft": "sleuth sft --config configs/docread_sft.yaml --out runs/sft",
    "plot": "sleuth plot runs/quick",
    "doctor": "sleuth doctor",
}


def subcommands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every runnable subcommand's parser by its words ("serve tinker")."""
    out = {}
    for action in parser._actions:  # argparse keeps its subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found = subcommands(sub, f"{prefix}{name} ")
                out.update(found or {f"{prefix}{name}": sub})
    return out


def add_examples(parser: argparse.ArgumentParser) -> None:
    for name, sub in subcommands(parser).items():
        if name in EXAMPLES:
            sub.epilog = f"example:\n  {EXAMPLES[name]}"
            sub.formatter_class = argparse.RawDescriptionHelpFormatter
