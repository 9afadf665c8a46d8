"""The `sleuth` command: each module of `cli/` adds its subcommands with `cli.args.command` in its `register(sub)`,
and `COMMANDS` lists the modules in the order `sleuth --help` shows them."""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from importlib.metadata import version as package_version

from sleuth.cli import doctor, index, runs, score, serve, tasks, train, view
from sleuth.cli import eval as eval_
from sleuth.cli.args import subcommands
from sleuth.core.errors import SleuthError, one_line
from sleuth.core.interrupts import ON_SIGNAL, exit_code, sigterm_as_interrupt

COMMANDS = (tasks, eval_, view, runs, score, index, serve, train, doctor)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sleuth", description="envs, agent loops and RL training for LLM agents")
    p.add_argument("--version", action="version", version=f"sleuth {package_version('sleuth')}")
    # The deepspeed launcher puts --local_rank=N before the subcommand (LOCAL_RANK is also in the environment).
    p.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)
    p.set_defaults(on_interrupt="interrupted")  # a command whose finished work resumes says how instead
    sub = p.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        module.register(sub)
    for name, parser in subcommands(p).items():
        if name in ON_SIGNAL:
            parser.epilog = "\n\n".join([*([parser.epilog] if parser.epilog else []),
                                          textwrap.fill(ON_SIGNAL[name], 100)])
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
        print(f"error: {one_line(str(e)) or type(e).__name__}", file=sys.stderr)
        return e.exit_code
    except Exception as e:
        if os.environ.get("SLEUTH_TRACEBACK") == "1":
            raise
        print(f"error: {type(e).__name__}: {one_line(str(e), 300) or 'no detail'} (an unexpected failure of "
              f"`sleuth {args.command}`; SLEUTH_TRACEBACK=1 shows where it happened)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
