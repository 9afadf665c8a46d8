"""`sleuth index build` and `sleuth search`: retrieval indexes and TREC runs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sleuth.cli.args import command
from sleuth.cli.args import fail as _fail
from sleuth.core.args import bounded, output_dir


def cmd_index_build(args: argparse.Namespace) -> int:
    import time

    from sleuth.envs.retrieval.corpus import load_corpus
    from sleuth.envs.retrieval.index import build_index, save_index

    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.force:  # before minutes of encoding
        what = "an index" if (out / "meta.json").exists() else "files"
        return _fail(f"{out} already holds {what}: pass --force to replace it, or choose another --out")
    try:
        docs = load_corpus(args.corpus, args.id_field, args.title_field, args.text_field)
        start = time.perf_counter()
        index = build_index(docs, args.kind, args.backend)
        save_index(index, out, replace=args.force)
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        return _fail(str(e))
    except OSError as e:
        return _fail(f"cannot write the index to {out}: {e.strerror or e}")
    print(f"{args.kind} index of {len(docs)} documents built in {time.perf_counter() - start:.1f} s: {args.out}")
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    from sleuth.envs.retrieval.index import load_index
    from sleuth.envs.retrieval.metrics import mean_scores
    from sleuth.envs.retrieval.trec import unique_queries, write_run

    try:
        qrels = _read_qrels(args.qrels) if args.qrels else None  # before the run: a bad path fails in a second
        index = load_index(args.index)
        queries, repeats = unique_queries(_read_queries(args.queries, args.query_id_field, args.query_text_field))
    except (FileNotFoundError, ValueError) as e:
        return _fail(str(e))
    if repeats:
        print(f"note: {repeats} repeated query ids skipped (a run ranks each query id once)", file=sys.stderr)
    results = []
    batch = 256
    for start in range(0, len(queries), batch):
        chunk = queries[start:start + batch]
        results += index.search([text for _, text in chunk], args.k)
    try:
        write_run(args.out, queries, results, args.tag)
    except ValueError as e:
        return _fail(str(e))
    print(f"{len(queries)} queries → {args.out}")
    if qrels is not None:
        scores = mean_scores({qid: [h.id for h in hits] for (qid, _), hits in zip(queries, results, strict=True)},
                             qrels)
        if not scores:
            return _fail(f"none of the {len(queries)} query ids is judged in {args.qrels} (queries: "
                         f"{', '.join(q for q, _ in queries[:3])}…; qrels: {', '.join(list(qrels)[:3])}…): "
                         "no metrics; check --query-id-field or the qrels file (the run is written)")
        print(json.dumps({"judged_queries": scores["judged_queries"], "queries": len(queries),
                          "ndcg@10": scores["ndcg@10"], "recall@100": scores["recall@100"]}))
    return 0


def _read_qrels(path: str) -> dict[str, dict[str, int]]:
    from sleuth.envs.retrieval.metrics import read_qrels

    if not Path(path).is_file():
        raise FileNotFoundError(f"qrels file not found: {path}")
    qrels = read_qrels(path)
    if not qrels:
        raise ValueError(f"{path} holds no judgements (BEIR's `query-id corpus-id score` or TREC's 4 columns)")
    return qrels


def _read_queries(path: str, id_field: str, text_field: str) -> list[tuple[str, str]]:
    if not Path(path).is_file():
        raise FileNotFoundError(f"queries file not found: {path}")
    out = []
    for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            out.append((str(rec[id_field]), str(rec[text_field])))
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{i + 1}: a query line needs {id_field!r} and {text_field!r} ({e})") from e
    return out


def register(sub: argparse._SubParsersAction) -> None:
    ix = sub.add_parser("index", help="retrieval indexes").add_subparsers(dest="index_command", required=True)
    b = command(ix, "build", cmd_index_build, "build a BM25, dense or hybrid index from a JSONL corpus",
                example="sleuth index build --corpus $SLEUTH_DATA/corpora/2wikimultihopqa_passages.jsonl --out runs/ix")
    b.add_argument("--corpus", required=True, help="JSONL (or .jsonl.gz), one document a line")
    b.add_argument("--kind", choices=["bm25", "dense", "hybrid"], default="bm25")
    b.add_argument("--backend", choices=["bm25s", "rank_bm25"], default="bm25s")
    b.add_argument("--out", type=output_dir, required=True, help="index directory (refused if it holds files)")
    b.add_argument("--force", action="store_true", help="replace an index already at --out (once the new one is built)")
    b.add_argument("--id-field", default="id")
    b.add_argument("--title-field", default="title")
    b.add_argument("--text-field", default="text")
    q = command(sub, "search", cmd_search, "batch search; writes a TREC run (qid Q0 docid rank score tag)",
                example="sleuth search --index runs/ix --queries queries.jsonl --out runs/ix.trec")
    q.add_argument("--index", required=True)
    q.add_argument("--queries", required=True, help='JSONL lines {"id", "text"}')
    q.add_argument("--k", type=bounded(int, 1), default=100, help="hits per query")
    q.add_argument("--out", required=True, help="a TREC run file (trec_eval's format); document ids holding "
                   "whitespace or %% are percent-encoded, repeated query ids are ranked once")
    q.add_argument("--tag", default="sleuth", help="the run's name (one word)")
    q.add_argument("--qrels", help="also print nDCG@10 and Recall@100 against these judgements")
    q.add_argument("--query-id-field", default="id")
    q.add_argument("--query-text-field", default="text")
