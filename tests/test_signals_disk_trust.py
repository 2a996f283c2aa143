"""The edges of a run: a full disk while output parts are written, and stop signals at any moment.

A full disk ends a run on any number of ranks with one line, exit code 2 and its complete cases kept; SIGUSR1,
however often and whenever it comes, ends a run with the requeue code 75 and one line that is not an error.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jobtext import QUICK, JobSpec
from test_ownership import complete_cases, small_disk

ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = shutil.which("mpiexec")
#: runs the CLI and sends itself SIGUSR1 at the places named on its command line
STOP_SCRIPT = ROOT / "tests" / "scripts" / "stop_signals.py"

#: forward+backward cases that save their output and gradients: about 0.5 MiB of parts each
PARTS_JOB = JobSpec({"name": "parts", **QUICK, "save_output": True},
                    defaults={"heads": 2, "head_dim": 8, "dtype": "float64", "pass": "forward+backward"},
                    cases=[{"name": "g", "grid": [32, 32], "patterns": [[64, 1], [256, 4]],
                            "sweep": {"scale": [i / 10 for i in range(1, 13)]}}])
STOP_JOB = PARTS_JOB.but(defaults={"pass": "forward"}, case={"sweep": {"scale": [0.1, 0.2, 0.3]}})


def command(ranks: int, *args: str) -> list[str]:
    """Python with ``args``: alone for one rank, under ``mpiexec`` for more."""
    if ranks > 1 and MPIEXEC is None:
        pytest.skip("needs mpiexec")
    python = [sys.executable, *args]
    return ["mpiexec", "-n", str(ranks), "--oversubscribe", *python] if ranks > 1 else python


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1", HILBERT_HPC_THREADS="1")
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def our_lines(stderr: str) -> list[str]:
    """The lines the program wrote to stderr (not the progress lines, not the launcher's banners)."""
    return [line for line in stderr.splitlines() if line.startswith("hilbert-hpc")]


# --- a full disk --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ranks", [1, 2])
def test_a_full_disk_while_parts_are_written_is_one_line_on_every_rank_count(tmp_path, ranks):
    """Each rank writes its part of the output and gradients; the disk fills up in the middle of a case. Before,
    two ranks ended with a traceback of h5py closing a dataset, MPI_ABORT and exit 1."""
    hilbert_hpc = command(ranks, "-m", "hilbert_hpc")
    with small_disk(tmp_path / "disk", "1200k") as disk:
        if disk is None:
            pytest.skip("needs permission to mount a tmpfs")
        (disk / "job.toml").write_text(PARTS_JOB.but(defaults={"ranks": ranks}).text())
        res = run([*hilbert_hpc, "run", "job.toml", "-o", "r.h5"], disk)
        assert res.returncode == 2, res.stderr
        line, = our_lines(res.stderr)
        assert line.startswith("hilbert-hpc: error: output: cannot write ") and line.endswith(
            ": No space left on device; its complete cases are kept; free some space and continue with --resume")
        for noise in ("Traceback", "internal error", "MPI_ABORT", "SIGTERM", "Exception ignored"):
            assert noise not in res.stderr, res.stderr
        kept = complete_cases(disk / "r.h5")
        assert 0 < len(kept) < 12
        subprocess.run(["mount", "-o", "remount,size=16m", str(disk)], check=True)
        again = run([*hilbert_hpc, "run", "job.toml", "-o", "r.h5", "--resume"], disk)
        assert again.returncode == 0, again.stderr
        assert again.stdout.count("skipped") == len(kept)          # their parts were checked and found whole
        assert len(complete_cases(disk / "r.h5")) == 12


# --- stop signals -------------------------------------------------------------------------------------------------

AT_THE_BOUNDARY = ("hilbert-hpc: stopped by SIGUSR1 at a case boundary: 1 of 3 cases are complete in r.h5; "
                   "continue with 'run --resume'")
AS_THE_RUN_ENDED = "hilbert-hpc: stopped by SIGUSR1 as the run ended; every case is complete in r.h5"


@pytest.mark.parametrize("ranks, places, said, kept", [
    # at the first case boundary, again as the run tidies up (the final flush), and once MPI has finalized
    pytest.param(1, "case,end,exit", AT_THE_BOUNDARY, 1, id="1-rank-thrice"),
    pytest.param(2, "case,end,exit", AT_THE_BOUNDARY, 1, id="2-ranks-thrice"),
    # once, after the last case boundary
    pytest.param(1, "end", AS_THE_RUN_ENDED, 3, id="1-rank-at-the-end"),
    pytest.param(2, "end", AS_THE_RUN_ENDED, 3, id="2-ranks-at-the-end")])
def test_any_number_of_sigusr1_at_any_moment_ends_the_run_with_75(tmp_path, ranks, places, said, kept):
    """Before, the signals after the stop met Python's default action (exit 138 under mpiexec, -10 alone), and
    the stop was printed as an error."""
    from hilbert_hpc.study.signals import REQUEUE_EXIT

    (tmp_path / "job.toml").write_text(STOP_JOB.but(defaults={"ranks": ranks}).text())
    res = run(command(ranks, str(STOP_SCRIPT), places, "run", "job.toml", "-o", "r.h5"), tmp_path)
    assert res.returncode == REQUEUE_EXIT, res.stderr
    assert our_lines(res.stderr) == [said] and "stop_signals:" not in res.stderr, res.stderr
    assert len(complete_cases(tmp_path / "r.h5")) == kept


def test_a_signal_before_the_case_loop_stops_the_run_at_its_first_boundary(tmp_path):
    """Held from the start of ``run`` (before, SIGUSR1 during the setup killed the process)."""
    from hilbert_hpc.study.jobfile import load_job
    from hilbert_hpc.study.runner import run_job
    from hilbert_hpc.study.signals import HeldStops, StoppedForRequeue

    (tmp_path / "job.toml").write_text(STOP_JOB.text())
    before = signal.getsignal(signal.SIGUSR1)
    with HeldStops() as held:
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert held.received == signal.SIGUSR1
        with pytest.raises(StoppedForRequeue, match="at a case boundary: 0 of 3 cases are complete"):
            run_job(load_job(tmp_path / "job.toml"), output=str(tmp_path / "r.h5"), stream=io.StringIO(),
                    progress=io.StringIO())
    assert signal.getsignal(signal.SIGUSR1) == before          # given back: this is not the program's own run


def test_a_signal_during_the_case_loop_is_held_after_it(tmp_path):
    from hilbert_hpc.study.signals import HeldStops, StopRequests, held_signal

    with HeldStops() as held:
        with StopRequests() as stops:
            os.kill(os.getpid(), signal.SIGUSR1)
        assert stops.received == held.received == held_signal() == signal.SIGUSR1
        os.kill(os.getpid(), signal.SIGUSR1)          # after the loop: still held, not Python's default action
    assert held_signal() == 0


# --- the abort hook -----------------------------------------------------------------------------------------------

class _TwoRanks:
    """A communicator of two ranks that records an abort instead of ending the process."""

    def __init__(self) -> None:
        self.aborted: list[int] = []

    def Get_size(self) -> int:  # noqa: N802 - mpi4py spelling
        return 2

    def Get_rank(self) -> int:  # noqa: N802
        return 0

    def Abort(self, code: int = 1) -> None:  # noqa: N802
        self.aborted.append(code)


def test_an_error_reported_while_the_program_runs_aborts_no_rank(monkeypatch, capsys):
    """Cython prints an error of a finalizer (h5py closing a dataset) through sys.excepthook, and the program
    goes on: that is no crash, and must not end every rank."""
    from hilbert_hpc.distributed.mpi import abort_on_exception

    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    comm = _TwoRanks()
    abort_on_exception(comm)
    error = RuntimeError("Can't decrement id ref count (file write failed: errno = 28)")
    sys.excepthook(RuntimeError, error, None)
    assert comm.aborted == [] and capsys.readouterr().err == ""
