"""The ``hilbert-hpc`` command line: run, info."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from . import __version__
from .errors import UserError


def _cmd_run(args: argparse.Namespace) -> int:
    from .jobfile import load_job
    from .runner import run_job

    job = load_job(args.job)
    run_job(job, output=args.output)
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from .info import print_info

    print_info()
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one sub-command per action."""
    parser = argparse.ArgumentParser(
        prog="hilbert-hpc",
        description="Hilbert-ordered dilated attention over very long sequences: studies, results, environment.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run the cases of a job file and write an HDF5 results file")
    run.add_argument("job", help="job file (TOML), e.g. jobs/quickstart.toml")
    run.add_argument("-o", "--output", help="results file (default: the job's [job].output)")
    run.set_defaults(func=_cmd_run)
    info = sub.add_parser("info", help="print the environment: CPU, GPUs, MPI library, versions")
    info.set_defaults(func=_cmd_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hilbert-hpc`` console script."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as exc:
        print(f"hilbert-hpc: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("hilbert-hpc: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
