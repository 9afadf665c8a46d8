"""Reading data-set records from what users have: JSONL (or a `.json` file of JSON lines), parquet, a
directory saved with `datasets.save_to_disk`, a directory of JSONL files, or a hub name where a hub is
reachable. Every failure names the file and, for JSONL, the line.

JSONL is parsed here, line by line, rather than by `datasets`' JSON builder, whose errors on a broken line
are a `DatasetGenerationError` dump without the line number; parquet and saved datasets go through
`datasets` (their formats are binary and `datasets` reads them well)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sleuth.core.errors import BadInput


class RecordError(BadInput):
    """A record file that cannot be read, naming the file (and line) and what is wrong."""


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    out = []
    with open(p, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                raise RecordError(f"{p} line {number}: not UTF-8 (byte {e.start})") from None
            except (ValueError, RecursionError) as e:
                msg = e.msg if isinstance(e, json.JSONDecodeError) else "unreadable"
                raise RecordError(f"{p} line {number}: not valid JSON ({msg})") from None
            if not isinstance(record, dict):
                raise RecordError(f"{p} line {number}: a record must be a JSON object, got {type(record).__name__}")
            out.append(record)
    if not out:
        raise RecordError(f"{p} holds no records (the file is empty)")
    return out


def read_records(path_or_name: str | Path, split: str | None = None) -> list[dict[str, Any]]:
    """The records of a file, a directory or a hub data set (`split` picks the hub split)."""
    p = Path(path_or_name)
    if not p.exists():
        import datasets

        datasets.disable_progress_bars()
        return list(datasets.load_dataset(str(path_or_name), split=split or "validation"))
    if p.is_dir():
        if (p / "dataset_info.json").exists() or (p / "dataset_dict.json").exists():
            return _saved_dataset(p, split)
        files = sorted(p.glob("*.jsonl")) + sorted(p.glob("*.parquet"))
        if not files:
            raise RecordError(f"no .jsonl or .parquet files (nor a saved dataset) in {p}")
        return [r for f in files for r in read_records(f)]
    if p.suffix == ".parquet":
        return _parquet(p)
    return read_jsonl(p)


def _parquet(p: Path) -> list[dict[str, Any]]:
    import datasets

    datasets.disable_progress_bars()
    try:
        rows = list(datasets.load_dataset("parquet", data_files=[str(p)], split="train"))
    except Exception as e:  # datasets wraps pyarrow's errors in its own generation error
        raise RecordError(f"{p} is not a readable parquet file ({type(e).__name__})") from None
    if not rows:
        raise RecordError(f"{p} holds no records")
    return rows


def _saved_dataset(p: Path, split: str | None) -> list[dict[str, Any]]:
    import datasets

    ds = datasets.load_from_disk(str(p))
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            if len(ds) != 1:
                raise RecordError(f"{p} is a dataset with splits {sorted(ds)}: name one")
            split = next(iter(ds))
        ds = ds[split]
    return list(ds)
