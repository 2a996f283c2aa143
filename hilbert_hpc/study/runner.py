"""Runs the cases of a job on every rank: sub-communicators, the case loop, results file and summary table.

One code path for 1..P ranks. A case on ``p`` ranks runs on the first ``p``
ranks: each measures its share (``measure.CaseRun``: inputs, timed calls,
accuracy), writes its output part when the job saves outputs
(``case_outputs``) and sends its timings to rank 0, which writes the case to
the results file. Every rank agrees at each case boundary on stops and errors.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence, TextIO

import numpy as np

from hilbert_hpc.study.case_outputs import write_case_outputs
from hilbert_hpc.errors import ConfigError, UserError
from hilbert_hpc.study.jobfile import Case, Job
from hilbert_hpc.study.measure import CaseRun, derive_metrics, judge_accuracy
from hilbert_hpc.core.patterns import useful_flops
from hilbert_hpc.core.precision import precision
from hilbert_hpc.study.provenance import provenance
from hilbert_hpc.study.record import Accuracy, CaseRecord, Metrics, Setup, Timings
from hilbert_hpc.study.results import ResultsFile
from hilbert_hpc.study.gradients import backward_pass
from hilbert_hpc.study.setup import CaseSetup, check_case
from hilbert_hpc.study.table import SummaryTable

__all__ = ["CaseLoop", "SubComms", "check_case", "interleave_groups", "interleave_notes", "run_case",
           "run_in_turn", "run_interleaved", "run_job"]


def run_case(setup: CaseSetup, job: Job, comm: Any, results: ResultsFile | None,
             table: SummaryTable | None, results_path: Path | None = None, results_id: str = "",
             measured: CaseRun | None = None) -> CaseRecord | None:
    """Run one case (its ``setup``) on every rank of ``comm``; rank 0 writes it and prints its row. Returns the
    record on rank 0.

    ``results_id`` is the identity of the results file (every rank), which its
    output parts carry. ``measured``: the case's CaseRun whose calls have all run
    already (interleaved repeats); it is only gathered and written. A failed
    write of an output part (any rank) or of the results file (rank 0) raises a
    UserError on the ranks that saw it; the case stays incomplete. The caller
    agrees on it with every rank at the next case boundary.
    """
    case = setup.case
    run = measured or CaseRun(setup, job, comm)
    t0 = time.perf_counter() - run.elapsed_s           # wall_s: this case's own work, not other cases'
    timings, outputs, accuracy = run.results() if measured else run.run()
    all_timings = comm.gather(timings, root=0)
    all_accuracy = comm.gather(accuracy, root=0)
    parts = digests = None
    if job.save_output:
        parts, digests = write_case_outputs(case, job, comm, run.layout, outputs, results, results_path, results_id)
    if run.rank != 0:
        return None
    stacked = {name: np.asarray([t[name] for t in all_timings], dtype=np.float64) for name in timings}
    accuracy = judge_accuracy(case, all_accuracy)
    record = CaseRecord(
        setup=Setup(ranks=run.ranks, transport=setup.transport.name, kernel=setup.kernel_name,
                    backward_kernel=setup.backward_kernel_name,
                    transport_reason=setup.transport.reason, placement=run.layout.placement,
                    long_schedules="; ".join(s.describe() for s in setup.schedules),
                    wall_s=time.perf_counter() - t0),
        timings=Timings(**stacked), metrics=Metrics(**derive_metrics(case, stacked)), accuracy=Accuracy(**accuracy))
    results.write_case(case, record, parts, (case.batch, case.tokens, case.heads, case.head_dim), run.layout.shard,
                       digests)
    table.row(case, record)
    return record


class SubComms:
    """One communicator per rank count of a job: the first ``p`` ranks of ``comm`` (collective)."""

    def __init__(self, comm: Any, sizes: set[int]) -> None:
        self.comm = comm
        self.subs: dict[int, Any] = {}
        rank = comm.Get_rank()
        for p in sorted(sizes):
            if p == comm.Get_size():
                self.subs[p] = comm
                continue
            from mpi4py import MPI

            sub = comm.Split(0 if rank < p else MPI.UNDEFINED, rank)
            self.subs[p] = None if sub == MPI.COMM_NULL else sub

    def get(self, ranks: int) -> Any:
        """The communicator of a case on ``ranks`` ranks, or None on the ranks that sit it out."""
        return self.subs[ranks]

    def free(self) -> None:
        """Release the split communicators."""
        for p, sub in self.subs.items():
            if sub is not None and sub is not self.comm:
                sub.Free()
        self.subs = {}


#: where the last boundary of a run is: a stop signal that came during the last case still ends the run with
#: the requeue code, on every rank
LAST_BOUNDARY = "after the last case"


class CaseLoop:
    """The boundaries of a run's case loop, agreed by every rank of the run: stop requests, errors, progress.

    Every rank of ``comm`` calls :meth:`boundary` / :meth:`errors` the same
    number of times (ranks that sit a case out too), so a stop or any rank's
    error ends every rank at the same point.
    """

    def __init__(self, comm: Any, stops: Any, todo: list[Case], complete: int, total: int, path: Path,
                 results_id: str, tracker: Any, results: ResultsFile | None = None) -> None:
        self.comm, self.stops, self.path, self.tracker = comm, stops, path, tracker
        self.results = results                         # rank 0's open results file (None on other ranks)
        self.results_id = results_id                   # what the run's output parts carry
        self.index = {c.case_id: i for i, c in enumerate(todo)}
        self.complete, self.total = complete, total
        self.failed: UserError | None = None
        self.rank0 = comm.Get_rank() == 0

    def boundary(self, where: str = "at a case boundary", dropped: str = "") -> None:
        """Raise any rank's error, or StoppedForRequeue when any rank was asked to stop (``dropped``: what is lost)."""
        import signal

        from hilbert_hpc.study.signals import StoppedForRequeue

        stop, self.failed = self.stops.agreed(self.comm, self.failed)
        self.errors(agreed=True)
        if stop:
            if self.replacing():
                raise StoppedForRequeue(f"stopped by {signal.Signals(stop).name} {where}, before the first case "
                                        f"was committed: the old {self.path} is unchanged; run again with "
                                        f"--overwrite to replace it", "run")
            raise StoppedForRequeue(f"stopped by {signal.Signals(stop).name} {where}: {self.complete} of "
                                    f"{self.total} cases are complete in {self.path}{dropped}; continue with "
                                    f"'run --resume'", "run")

    def replacing(self) -> bool:
        """True on rank 0 while an ``--overwrite`` run has not yet replaced the old file (nothing committed)."""
        return self.results is not None and not self.results.started

    def errors(self, agreed: bool = False) -> None:
        """Raise any rank's error on every rank; a stop request waits for the next :meth:`boundary`."""
        if not agreed:
            _, self.failed = self.stops.agreed(self.comm, self.failed)
        if self.failed is not None:
            raise self.failed

    def attempt(self, work: Callable[[], Any]) -> None:
        """Run ``work`` on this rank; a UserError is kept for the next boundary (where every rank raises it)."""
        try:
            work()
        except UserError as exc:
            self.failed = exc

    def status(self) -> str:
        """What is kept so far and how to go on, e.g. "2 of 4 cases are complete in r.h5; continue with 'run
        --resume'" (said when the launcher ends the run)."""
        if self.replacing():
            return f"nothing was committed: the old {self.path} is unchanged; run again with --overwrite to replace it"
        return f"{self.complete} of {self.total} cases are complete in {self.path}; continue with 'run --resume'"

    def finished(self, case: Case) -> None:
        """Count ``case`` complete (unless this rank failed it) and print the progress line."""
        if self.failed is None:
            self.tracker.advance(self.index[case.case_id], f"{case.case_id} on {case.ranks} rank(s)")
            self.complete += 1


def run_in_turn(job: Job, setups: dict[str, CaseSetup], loop: CaseLoop, subs: "SubComms",
                results: ResultsFile | None, table: SummaryTable | None, stream: TextIO, done: set[str]) -> None:
    """Every case not yet complete, one after another, each with all of its repeats (the default)."""
    for case in job.cases:
        if case.case_id in done:
            if loop.rank0:
                print(f"{case.case_id}  complete in {loop.path}, skipped", file=stream, flush=True)
            continue
        loop.boundary()
        sub = subs.get(case.ranks)
        if sub is not None:
            loop.attempt(lambda: run_case(setups[case.case_id], job, sub, results, table, loop.path,
                                          loop.results_id))
        loop.finished(case)
    loop.boundary(LAST_BOUNDARY)


def interleave_groups(cases: list[Case]) -> list[list[Case]]:
    """Cases grouped by rank count (groups in the order of their first case), job order inside a group."""
    groups: dict[int, list[Case]] = {}
    for case in cases:
        groups.setdefault(case.ranks, []).append(case)
    return list(groups.values())


def interleave_notes(job: Job, todo: list[Case]) -> list[str]:
    """With ``interleave``: one note per group of more than one case, with the input memory it holds at once."""
    if not job.interleave:
        return []
    notes = []
    for group in interleave_groups(todo):
        if len(group) < 2:
            continue
        ranks = group[0].ranks
        held = sum(3 * c.batch * (c.tokens // ranks) * c.heads * c.head_dim * precision(c.dtype).itemsize
                   for c in group)
        notes.append(f"interleave: the {len(group)} cases on {ranks} rank(s) ({group[0].case_id} ... "
                     f"{group[-1].case_id}) run their repeats in turn; their inputs stay in memory together, "
                     f"{held / (1 << 30):.3g} GiB per rank")
    return notes


def run_interleaved(job: Job, setups: dict[str, CaseSetup], loop: CaseLoop, subs: "SubComms",
                    results: ResultsFile | None, table: SummaryTable | None, stream: TextIO, done: set[str]) -> None:
    """Cases grouped by rank count; in a group, call ``r`` (warm-ups first) of every case runs before call ``r+1``.

    Clock drift then falls on every case of a group alike. Each case's inputs
    are made before the first call and kept until the group's calls are done;
    each first call is checked for accuracy as without interleaving. The cases
    are then written in job order. A stop between calls drops the group's
    cases (none is written); one while they are written waits for the group.
    """
    if loop.rank0:
        for case in job.cases:
            if case.case_id in done:
                print(f"{case.case_id}  complete in {loop.path}, skipped", file=stream, flush=True)
    for group in interleave_groups([c for c in job.cases if c.case_id not in done]):
        loop.boundary()
        sub = subs.get(group[0].ranks)
        runs: list[CaseRun] = []
        if sub is not None:
            loop.attempt(lambda: runs.extend(CaseRun(setups[c.case_id], job, sub).start() for c in group))
        for _ in range(job.warmup + job.repeats):
            loop.boundary("between interleaved repeats", f" (the {len(group)} case(s) of the group on "
                          f"{group[0].ranks} rank(s) run again)")
            if sub is not None:
                loop.attempt(lambda: [run.step() for run in runs])
        measured = {run.case.case_id: run for run in runs}
        for case in group:
            loop.errors()
            if sub is not None:
                loop.attempt(lambda: run_case(setups[case.case_id], job, sub, results, table, loop.path,
                                              loop.results_id, measured=measured.pop(case.case_id)))
            loop.finished(case)
        del runs, measured
    loop.boundary(LAST_BOUNDARY)


def run_job(job: Job, output: str | None = None, stream: TextIO | None = None, comm: Any = None,
            resume: bool = False, progress: TextIO | None = None, overwrite: bool = False,
            setups: dict[str, CaseSetup] | None = None, left_out: Sequence[str] = ()) -> Path:
    """Run every case of ``job`` on the ranks of ``comm`` it asks for; rank 0 writes the file and prints the table.

    A case on ``p`` ranks runs on the first ``p`` ranks (a sub-communicator), so
    one allocation runs a whole scaling curve. Rank 0 owns the results file for
    the whole run (``ResultsFile.open``: refusals, lock, temporary name): an
    existing file is continued with ``resume`` (complete, sound cases of the
    same job are skipped) or replaced with ``overwrite``, else refused.
    SIGUSR1/SIGTERM/SIGINT stop the job at the next case boundary (all ranks
    agree) with the file flushed: ``StoppedForRequeue``. An I/O error on any rank
    is agreed at the boundary too, so every rank ends with the same one line.
    ``setups``: the cases' setups by case id where the caller made them (``check_case``), else made here.
    Cases of the job's optional backends that do not fit the memory of their ranks are left out with a note;
    those notes and ``left_out`` (the caller's, e.g. ``setup.runnable_here``'s) are recorded in the root
    attribute ``left_out``.
    """
    from hilbert_hpc.study.jobfile import accuracy_rows_notes
    from hilbert_hpc.distributed.mpi import agree
    from hilbert_hpc.distributed.mpi import bind_gpu, world
    from hilbert_hpc.study.plan import check_job_fits
    from hilbert_hpc.study.progress import Progress
    from hilbert_hpc.study.signals import StopRequests

    comm = comm or world()
    stream = stream or sys.stdout               # looked up now: the caller's stdout, not the one at import
    setups = dict(setups or {})
    for case in job.cases:
        if case.case_id not in setups:
            setups[case.case_id] = check_case(case)        # the one setup of each case, passed down
        if case.ranks > comm.Get_size():
            raise ConfigError(f"needs {case.ranks} ranks, this run has {comm.Get_size()}", f"{case.case_id}.ranks")
    if any(s.backend.on_gpu for s in setups.values()):
        bind_gpu(comm)
    job, unfit = check_job_fits(job, comm, setups)
    path = Path(output or job.output)
    rank0 = comm.Get_rank() == 0
    for note in unfit if rank0 else ():
        print(f"note: {note}", file=sys.stderr)
    if not job.cases:
        raise ConfigError("no case of the job fits the memory here", "job.optional_backends")
    prov = provenance(comm)
    prov["left_out"] = [*left_out, *unfit]                  # the optional backends' cases this run leaves out
    results, error = None, None
    if rank0:
        try:
            results = ResultsFile.open(path, job, prov, resume=resume, overwrite=overwrite)
        except UserError as exc:
            error = exc
    error = agree(comm, error)                 # only rank 0 can fail here, and then it holds no file
    if error is not None:
        raise error
    kept, results_id = comm.bcast((results.kept, results.results_id) if rank0 else None, root=0)
    done = set(kept)
    todo = [c for c in job.cases if c.case_id not in done]
    table = SummaryTable(stream, backward=any(backward_pass(c) for c in todo)) if rank0 else None
    tracker = Progress([useful_flops(c.tokens, c.heads, c.head_dim, c.patterns, c.causal, c.batch) for c in todo],
                       (progress or sys.stderr) if rank0 else None)
    subs = SubComms(comm, {c.ranks for c in todo})
    try:
        loop = CaseLoop(comm, None, todo, len(job.cases) - len(todo), len(job.cases), path, results_id, tracker,
                        results)
        with StopRequests(loop.status) as stops:
            loop.stops = stops
            if rank0:
                print(f"hilbert-hpc: job {job.name!r}, {len(job.cases)} case(s) on up to {comm.Get_size()} "
                      f"rank(s), results -> {path}", file=stream)
                for note in results.notes + accuracy_rows_notes(job) + interleave_notes(job, todo):
                    print(f"hilbert-hpc: note: {note}", file=sys.stderr, flush=True)
                table.header()
            run_cases = run_interleaved if job.interleave else run_in_turn
            run_cases(job, setups, loop, subs, results, table, stream, done)
    finally:
        subs.free()
        if results is not None:
            results.close(quiet=sys.exc_info()[0] is not None)
    return path
