"""Checkpoint/resume: a job killed mid-run keeps its complete cases; --resume finishes it identically."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np

from clirun import run_in_process
from jobtext import JobSpec

ROOT = Path(__file__).resolve().parents[1]

SWEEP = {"ordering": ["natural", "hilbert"], "causal": [False, True], "scale": [0.1, 0.2]}
RESUME_JOB = JobSpec({"name": "resume", "repeats": 2, "warmup": 0, "accuracy_rows": 4, "save_output": True},
                     defaults={"heads": 4, "head_dim": 32, "dtype": "float64"},
                     cases=[{"name": "g", "grid": [64, 64], "patterns": [[256, 1], [1024, 4], [4096, 16]],
                             "sweep": SWEEP}])
JOB = RESUME_JOB.text()


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), HDF5_USE_FILE_LOCKING="FALSE")


def _run(args, cwd) -> subprocess.CompletedProcess:
    return run_in_process(args, cwd, env={"HDF5_USE_FILE_LOCKING": "FALSE"})


def test_kill_then_resume_equals_uninterrupted(tmp_path):
    (tmp_path / "job.toml").write_text(JOB)
    full = _run(["run", "job.toml", "-o", "full.h5"], tmp_path)
    assert full.returncode == 0, full.stderr

    proc = subprocess.Popen([sys.executable, "-m", "hilbert_hpc", "run", "job.toml", "-o", "part.h5"], cwd=tmp_path,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    for line in proc.stdout:
        if line.startswith("0001-g"):
            os.killpg(proc.pid, signal.SIGKILL)  # in the middle of case 0002
            break
    proc.wait(timeout=60)
    with h5py.File(tmp_path / "part.h5", "r") as f:
        complete = [cid for cid, g in f["cases"].items() if g.attrs.get("complete")]
    assert complete[:2] == ["0000-g", "0001-g"] and len(complete) < 8

    resumed = _run(["run", "job.toml", "-o", "part.h5", "--resume"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.count("skipped") == len(complete)
    with h5py.File(tmp_path / "full.h5") as a, h5py.File(tmp_path / "part.h5") as b:
        assert sorted(a["cases"]) == sorted(b["cases"])
        for cid in a["cases"]:
            assert b["cases"][cid].attrs["complete"]
            assert np.array_equal(a["cases"][cid]["output"][...], b["cases"][cid]["output"][...])
        assert len(__import__("json").loads(b.attrs["resumes"])) == 1


def test_resume_refuses_other_parameters_and_foreign_files(tmp_path):
    (tmp_path / "job.toml").write_text(JOB)
    assert _run(["run", "job.toml", "-o", "r.h5"], tmp_path).returncode == 0
    (tmp_path / "other.toml").write_text(RESUME_JOB.but(defaults={"head_dim": 16}).text())
    res = _run(["run", "other.toml", "-o", "r.h5", "--resume"], tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "another version of job 'resume' (defaults.head_dim is 32 in the file, 16 here)" in res.stderr
    with h5py.File(tmp_path / "foreign.h5", "w") as f:
        f["x"] = 1
    res = _run(["run", "job.toml", "-o", "foreign.h5", "--resume"], tmp_path)
    assert res.returncode == 2 and "not a hilbert-hpc results file" in res.stderr


def _complete_cases(path: Path) -> list[str]:
    with h5py.File(path, "r") as f:
        return [cid for cid, g in f["cases"].items() if g.attrs.get("complete")]


def test_sigusr1_stops_at_a_case_boundary_with_the_requeue_code(tmp_path):
    from hilbert_hpc.study.signals import REQUEUE_EXIT

    (tmp_path / "job.toml").write_text(JOB)
    proc = subprocess.Popen([sys.executable, "-m", "hilbert_hpc", "run", "job.toml", "-o", "sig.h5"], cwd=tmp_path,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("0001-g"):
            proc.send_signal(signal.SIGUSR1)          # during case 0002: it finishes, then the run stops
            break
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == REQUEUE_EXIT, err
    assert "SIGUSR1" in err and "--resume" in err and "Traceback" not in err
    complete = _complete_cases(tmp_path / "sig.h5")
    # the signal lands after case 0001's row: the run stops at the next boundary (after 0001, or after 0002 if
    # that case had begun), and every case in the file is complete: none was cut off or started after the stop
    assert complete in (["0000-g", "0001-g"], ["0000-g", "0001-g", "0002-g"])
    with h5py.File(tmp_path / "sig.h5", "r") as f:
        assert sorted(f["cases"]) == complete
    resumed = _run(["run", "job.toml", "-o", "sig.h5", "--resume"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert len(_complete_cases(tmp_path / "sig.h5")) == 8


def test_sigusr1_under_mpiexec_stops_every_rank(tmp_path):
    import shutil

    from hilbert_hpc.study.signals import REQUEUE_EXIT

    if shutil.which("mpiexec") is None:
        import pytest

        pytest.skip("needs mpiexec")
    (tmp_path / "job.toml").write_text(RESUME_JOB.but(defaults={"ranks": "pow2"}).text())
    env = dict(_env(), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(["mpiexec", "-n", "2", "--oversubscribe", sys.executable, "-m", "hilbert_hpc", "run",
                             "job.toml", "-o", "mpi.h5"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("0001-g"):
            proc.send_signal(signal.SIGUSR1)          # mpiexec forwards SIGUSR1 to both ranks
            break
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == REQUEUE_EXIT, err
    assert err.count("stopped by SIGUSR1") == 1       # one message, from rank 0
    assert 2 <= len(_complete_cases(tmp_path / "mpi.h5")) < 16


def test_output_of_a_results_file_with_percent_in_its_name(tmp_path):
    """The virtual dataset escapes '%' (HDF5 reads it as a format character in source file names)."""
    (tmp_path / "job.toml").write_text(RESUME_JOB.but(
        case={"sweep": {**SWEEP, "ordering": ["hilbert"], "scale": [0.1]}}).text())
    res = _run(["run", "job.toml", "-o", "run%1.h5"], tmp_path)
    assert res.returncode == 0, res.stderr
    with h5py.File(tmp_path / "run%1.h5") as f:
        for g in f["cases"].values():
            out = g["output"][...]
            assert out.shape == (1, 4096, 4, 32) and np.isfinite(out).all()
