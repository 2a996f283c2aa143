"""The edges of a run: a full disk while output parts are written, and stop signals at any moment.

A full disk ends a run on any number of ranks with one line, exit code 2 and its complete cases kept; SIGUSR1,
however often and whenever it comes, ends a run with the requeue code 75 and one line that is not an error.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jobtext import QUICK, JobSpec
from test_ownership import complete_cases, small_disk

ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = shutil.which("mpiexec")

#: forward+backward cases that save their output and gradients: about 0.5 MiB of parts each
PARTS_JOB = JobSpec({"name": "parts", **QUICK, "save_output": True},
                    defaults={"heads": 2, "head_dim": 8, "dtype": "float64", "pass": "forward+backward"},
                    cases=[{"name": "g", "grid": [32, 32], "patterns": [[64, 1], [256, 4]],
                            "sweep": {"scale": [i / 10 for i in range(1, 13)]}}])


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
