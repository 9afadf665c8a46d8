"""The `sleuth` command."""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from importlib.metadata import version as package_version
from pathlib import Path

from sleuth.cli.args import bounded, one_line, output_dir
from sleuth.cli.args import fail as _fail
from sleuth.cli.doctor import add_doctor_parser
from sleuth.cli.eval import add_eval_parser
from sleuth.cli.examples import add_examples, subcommands
from sleuth.cli.serve import add_serve_parsers
from sleuth.cli.train import add_training_parsers
from sleuth.cli.view import add_view_parser
from sleuth.core.errors import SleuthError
from sleuth.core.interrupts import ON_SIGNAL, exit_code, sigterm_as_interrupt


def cmd_envs(args: argparse.Namespace) -> int:
    from sleuth.envs.registry import registrations

    for env_id, reg in registrations().items():
        print(f"{env_id:32s} {reg.target:44s} {reg.source}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from sleuth.agents.eval.compare import compare, to_markdown, write_comparison_plot

    try:
        result = compare(args.run_a, args.run_b)
    except (FileNotFoundError, ValueError) as e:
        return _fail(str(e))
    text = to_markdown(result)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_comparison_plot(result, out / "compare.png")
        (out / "compare.md").write_text(f"# Comparison\n\n{text}\n\n![comparison](compare.png)\n")
        print(f"report: {out / 'compare.md'}")
    return 0


def cmd_judge_check(args: argparse.Namespace) -> int:
    from sleuth.agents.eval.judge_check import judge_check
    from sleuth.tasks import load_tasks
    from sleuth.verifiers.judge import JudgeConfigError

    if not (args.judge or args.group_judge):
        return _fail("give --judge FILE (a pointwise judge), --group-judge FILE (a group judge), or both")
    try:
        tasks = [t for t in load_tasks(args.tasks, limit=args.limit) if t.answer]
    except (FileNotFoundError, ValueError) as e:
        return _fail(str(e))
    if len(tasks) < 2:
        return _fail(f"{args.tasks} has {len(tasks)} task(s) with a gold answer: the check needs at least 2")
    try:
        result = judge_check(tasks, args.judge, args.group_judge, Path(args.out))
    except (JudgeConfigError, ValueError) as e:
        return _fail(str(e))
    print((Path(args.out) / "judge_check.md").read_text())
    print(f"report: {Path(args.out) / 'judge_check.md'} (data: judge_check.json, judge_check.png)")
    scored = result.get("pointwise", {}).get("scored", 0) + (result["group"]["calls"] - result["group"]["unreadable"]
                                                             if "group" in result else 0)
    if not scored:
        return _fail("the judge scored nothing: every call failed or gave a reply its settings cannot read "
                     "(see the report)")
    return 0


def cmd_bfcl_table(args: argparse.Namespace) -> int:
    from sleuth.agents.eval.bfcl_table import bfcl_report

    if len(args.runs) > 2:
        return _fail(f"bfcl-table takes one run or two (A B, paired), not {len(args.runs)}")
    for run in args.runs:
        if not (Path(run) / "trajectories.jsonl").is_file():
            return _fail(f"no eval run at {run} (no trajectories.jsonl)")
    try:
        print(bfcl_report(args.runs, args.out))
    except ValueError as e:
        return _fail(str(e))
    if args.out:
        print(f"report: {Path(args.out) / 'bfcl.md'}")
    return 0


def cmd_summary(args: argparse.Namespace) -> int:
    from sleuth.agents.eval.run_summary import summarize

    if not Path(args.run).is_dir():
        return _fail(f"no run directory at {args.run}: `make run` writes runs/main")
    print(summarize(args.run))
    print(f"summary: {Path(args.run) / 'summary.md'}")
    print(f"what the agents did, episode by episode: sleuth view {args.run} (or --html {Path(args.run) / 'view.html'})")
    return 0


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
    from sleuth.envs.retrieval.metrics import ndcg_at_k, recall_at_k
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
        judged = [(qid, [h.id for h in hits]) for (qid, _), hits in zip(queries, results, strict=True) if qid in qrels]
        if not judged:
            return _fail(f"none of the {len(queries)} query ids is judged in {args.qrels} (queries: "
                         f"{', '.join(q for q, _ in queries[:3])}…; qrels: {', '.join(list(qrels)[:3])}…): "
                         "no metrics; check --query-id-field or the qrels file (the run is written)")
        ndcg = sum(ndcg_at_k(r, qrels[q], 10) for q, r in judged) / len(judged)
        rec = sum(recall_at_k(r, qrels[q], 100) for q, r in judged) / len(judged)
        print(json.dumps({"judged_queries": len(judged), "queries": len(queries), "ndcg@10": round(ndcg, 4),
                          "recall@100": round(rec, 4)}))
    return 0


def _read_qrels(path: str) -> dict[str, dict[str, int]]:
    from sleuth.envs.retrieval.metrics import read_qrels

    if not Path(path).is_file():
        raise FileNotFoundError(f"qrels file not found: {path}")
    qrels = read_qrels(path)
    if not qrels:
        raise ValueError(f"{path} holds no judgements (BEIR's `query-id corpus-id score` or TREC's 4 columns)")
    return qrels


def cmd_build_swe(args: argparse.Namespace) -> int:
    from sleuth.sandbox.repos import RepoError
    from sleuth.synth.swe import SWEBuilder

    try:
        builder = SWEBuilder(args.package, args.out, n=args.n, seed=args.seed, workers=args.workers,
                             max_tries=args.max_tries, test_deps=tuple(d for d in args.test_deps.split(",") if d))
        summary = builder.build()
    except (ValueError, RepoError, RuntimeError) as e:
        return _fail(str(e))
    print(json.dumps(summary, indent=2))
    return 0 if summary["tasks"] >= args.n else _fail(f"only {summary['tasks']} of {args.n} tasks found "
                                                       f"after {summary['tried']} mutants (raise --max-tries)")


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


def build_parser() -> argparse.ArgumentParser:
    from sleuth.verifiers.registry import verifier_names

    verifiers = verifier_names()  # plugins' included
    p = argparse.ArgumentParser(prog="sleuth", description=__doc__)
    p.add_argument("--version", action="version", version=f"sleuth {package_version('sleuth')}")
    # The deepspeed launcher puts --local_rank=N before the subcommand (LOCAL_RANK is also in the environment).
    p.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)
    p.set_defaults(on_interrupt="interrupted")  # a command whose finished work resumes says how instead
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("envs", help="list registered environments").set_defaults(fn=cmd_envs)
    add_eval_parser(sub)
    add_view_parser(sub)
    c = sub.add_parser("compare", help="two eval runs side by side, with paired-bootstrap confidence intervals")
    c.add_argument("run_a")
    c.add_argument("run_b")
    c.add_argument("--out", help="also write compare.md and compare.png here")
    c.set_defaults(fn=cmd_compare)
    b = sub.add_parser("bfcl-table", help="the BFCL leaderboard table of one eval run over bfcl: tasks, or of two "
                       "paired (B − A)")
    b.add_argument("runs", nargs="+", metavar="RUN", help="one or two `sleuth eval` output directories")
    b.add_argument("--out", help="also write bfcl.md and bfcl.json here")
    b.set_defaults(fn=cmd_bfcl_table)
    sm = sub.add_parser("summary", help="what a `make run` directory showed: models, paired CIs, stage times, "
                        "reports (writes summary.md and summary.png there)")
    sm.add_argument("run", nargs="?", default="runs/main")
    sm.set_defaults(fn=cmd_summary)
    jc = sub.add_parser("judge-check", help="how far an LLM judge agrees with a rule and how biased it is (position, "
                        "length), on QA questions with gold answers")
    jc.add_argument("--judge", metavar="FILE", help="a pointwise judge's settings (see docs/verifiers.md)")
    jc.add_argument("--group-judge", metavar="FILE", help="a group judge's settings")
    jc.add_argument("--tasks", default="hotpotqa:dev", help="QA tasks with gold answers (default hotpotqa:dev)")
    jc.add_argument("--limit", type=bounded(int, 2), default=40, help="questions (default 40)")
    jc.add_argument("--out", default="runs/judge_check", help="where judge_check.md / .json / .png go")
    jc.set_defaults(fn=cmd_judge_check)
    s = sub.add_parser("score", help="score JSONL records (data-set layout + a 'response' field) with a verifier")
    s.add_argument("--verifier", required=True, help=f"a verifier: {verifiers}")
    s.add_argument("--input", required=True, help="JSONL records in their data set's layout, each with a 'response'")
    s.add_argument("--out", required=True, help="JSONL: each record with 'score' and 'details' (never the input file)")
    s.add_argument("--workers", type=bounded(int, 1), default=2,
                   help="records scored in parallel (code, swe: sandbox runs)")
    s.add_argument("--no-extract", action="store_true",
                   help="score the response as it is "
                        "(default: the answer / program / patch in it, as every entry point does)")
    s.set_defaults(fn=cmd_score)
    ad = sub.add_parser("adapters", help="where the TRL / verl / OpenRLHF verifier adapters are (file paths)")
    ad.add_argument("--path", choices=["trl", "verl", "openrlhf"], help="print only this adapter's file")
    ad.set_defaults(fn=cmd_adapters)
    ix = sub.add_parser("index", help="retrieval indexes").add_subparsers(dest="index_command", required=True)
    b = ix.add_parser("build", help="build a BM25, dense or hybrid index from a JSONL corpus")
    b.add_argument("--corpus", required=True, help="JSONL (or .jsonl.gz), one document a line")
    b.add_argument("--kind", choices=["bm25", "dense", "hybrid"], default="bm25")
    b.add_argument("--backend", choices=["bm25s", "rank_bm25"], default="bm25s")
    b.add_argument("--out", type=output_dir, required=True, help="index directory (refused if it holds files)")
    b.add_argument("--force", action="store_true", help="replace an index already at --out (once the new one is built)")
    b.add_argument("--id-field", default="id")
    b.add_argument("--title-field", default="title")
    b.add_argument("--text-field", default="text")
    b.set_defaults(fn=cmd_index_build)
    q = sub.add_parser("search", help="batch search; writes a TREC run (qid Q0 docid rank score tag)")
    q.add_argument("--index", required=True)
    q.add_argument("--queries", required=True, help='JSONL lines {"id", "text"}')
    q.add_argument("--k", type=bounded(int, 1), default=100, help="hits per query")
    q.add_argument("--out", required=True, help="a TREC run file (trec_eval's format); document ids holding "
                   "whitespace or %% are percent-encoded, repeated query ids are ranked once")
    q.add_argument("--tag", default="sleuth", help="the run's name (one word)")
    q.add_argument("--qrels", help="also print nDCG@10 and Recall@100 against these judgements")
    q.add_argument("--query-id-field", default="id")
    q.add_argument("--query-text-field", default="text")
    q.set_defaults(fn=cmd_search)
    add_serve_parsers(sub, verifiers)
    tk = sub.add_parser("tasks", help="build task sets").add_subparsers(dest="tasks_command", required=True)
    bs = tk.add_parser("build-swe", help="synthesise SWE tasks from a PyPI package's sdist and its own tests")
    bs.add_argument("--package", required=True, metavar="NAME==VERSION")
    bs.add_argument("--n", type=bounded(int, 1), default=30, help="tasks wanted")
    bs.add_argument("--out", required=True, help="JSONL of task records (appended to; resumes)")
    bs.add_argument("--seed", type=int, default=0)
    bs.add_argument("--workers", type=bounded(int, 1), default=2, help="mutants tested at once (sandbox runs)")
    bs.add_argument("--max-tries", type=bounded(int, 1), help="mutants to try at most (default 8 x n)")
    bs.add_argument("--test-deps", default="", help="comma list of extra requirements its tests need")
    bs.set_defaults(fn=cmd_build_swe)
    add_training_parsers(sub)
    add_doctor_parser(sub)
    add_examples(p)
    for name, sub in subcommands(p).items():
        if name in ON_SIGNAL:
            sub.epilog = "\n\n".join([*([sub.epilog] if sub.epilog else []), textwrap.fill(ON_SIGNAL[name], 100)])
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand. Its expected failures are one `error:` line each (`cli.args.fail`, or a `SleuthError`
    escaping with its branch's exit status); anything else
    that escapes is a fault sleuth did not foresee, still said in one line (exit 1), with its traceback only
    when `SLEUTH_TRACEBACK=1` asks for it."""
    args = build_parser().parse_args(argv)
    # A "module:Class" the user names (an env, a verifier, an agent) imports from the working directory, as
    # `python -m` and uvicorn's app paths do; appended, so a file there never shadows an installed module.
    # Processes sleuth starts (env servers, Ray workers) do not inherit it: there the module must be installed
    # or on PYTHONPATH.
    sys.path.append(os.getcwd())
    try:
        with sigterm_as_interrupt():  # SIGTERM (a scheduler's preemption) ends a command as Ctrl-C does
            return args.fn(args)
    except KeyboardInterrupt as e:  # a command that can continue says how (`on_interrupt`)
        print("\n" + args.on_interrupt, file=sys.stderr)
        return exit_code(e)  # 130 (SIGINT) or 143 (SIGTERM)
    except SleuthError as e:  # foreseen: its one line, and its branch's exit status (`core.errors`)
        print(f"error: {one_line(str(e), 300) or type(e).__name__}", file=sys.stderr)
        return e.exit_code
    except Exception as e:
        if os.environ.get("SLEUTH_TRACEBACK") == "1":
            raise
        print(f"error: {type(e).__name__}: {one_line(str(e), 300) or 'no detail'} (an unexpected failure of "
              f"`sleuth {args.command}`; SLEUTH_TRACEBACK=1 shows where it happened)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
