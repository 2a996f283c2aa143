"""``mpiexec -n 2 hilbert-hpc ...`` end to end: results equal one rank's, bad input and crashes end every rank."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from jobtext import DROP, JobSpec

ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = shutil.which("mpiexec")
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="needs mpiexec on PATH")

SWEEP = {"ordering": ["natural", "hilbert"], "causal": [False, True]}
RANKS_JOB = JobSpec({"name": "ranks", "repeats": 1, "warmup": 0, "accuracy_rows": 12, "save_output": True},
                    defaults={"heads": 3, "head_dim": 8, "dtype": "float64"},
                    cases=[{"name": "grid", "grid": [16, 16], "patterns": [[64, 1], [128, 4], [256, 8]],
                            "sweep": SWEEP}])
JOB = RANKS_JOB.text()


def mpirun(ranks: int, *args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1", HILBERT_HPC_THREADS="1")
    cmd = [MPIEXEC, "-n", str(ranks), "--oversubscribe", sys.executable, *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_two_ranks_equal_one_rank(tmp_path):
    (tmp_path / "job.toml").write_text(JOB)
    one = mpirun(1, "-m", "hilbert_hpc", "run", "job.toml", "-o", "one.h5", cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    two = mpirun(2, "-m", "hilbert_hpc", "run", "job.toml", "-o", "two.h5", cwd=tmp_path)
    assert two.returncode == 0, two.stderr
    assert two.stdout.count("hilbert-hpc: job") == 1, "only rank 0 prints"
    with h5py.File(tmp_path / "one.h5") as a, h5py.File(tmp_path / "two.h5") as b:
        assert b.attrs["ranks"] == 2
        assert set(a["cases"]) == set(b["cases"]) and len(b["cases"]) == 4
        for cid in a["cases"]:
            ga, gb = a["cases"][cid], b["cases"][cid]
            assert gb.attrs["complete"] and gb.attrs["ranks"] == 2
            assert gb["timings/attention"].shape == (2, 1)
            assert gb["timings/bytes_sent"][...].max() > 0, "the 256-token pattern spans both ranks"
            out_a, out_b = ga["output"][...], gb["output"][...]
            assert np.abs(out_a - out_b).max() <= 1e-12 * np.abs(out_a).max()
            assert gb["accuracy"].attrs["max_rel_err"] < 1e-12
            assert gb["accuracy"].attrs["rows"] == 12


def test_bad_job_reports_once_and_exits_2_on_every_rank(tmp_path):
    (tmp_path / "bad.toml").write_text(RANKS_JOB.but(defaults={"colour": 3}).text())
    res = mpirun(2, "-m", "hilbert_hpc", "run", "bad.toml", cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.count("hilbert-hpc: error:") == 1 and "colour" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "results").exists()


def test_ranks_that_cut_segments_are_refused(tmp_path):
    (tmp_path / "job.toml").write_text(RANKS_JOB.but(case={"grid": [16, 12], "patterns": [[48, 1], [192, 8]]}).text())
    res = mpirun(3, "-m", "hilbert_hpc", "run", "job.toml", cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("hilbert-hpc: error:") == 1 and "shard length 64" in res.stderr


def test_exception_on_one_rank_ends_every_rank(tmp_path):
    t0 = time.monotonic()
    res = mpirun(2, str(ROOT / "tests" / "scripts" / "fail_on_one_rank.py"), cwd=tmp_path, timeout=60)
    assert time.monotonic() - t0 < 30
    assert res.returncode != 0
    assert "injected failure on rank 1" in res.stderr


def test_file_input_on_two_ranks_equals_one_rank(tmp_path):
    job = RANKS_JOB.but(defaults={"heads": DROP, "head_dim": DROP}, cases=[
        {"name": "file", "input": str(ROOT / "data" / "grid32x32.h5"), "patterns": [[64, 1], [256, 4], [1024, 16]],
         "sweep": SWEEP}]).text()
    assert "grid32x32" in job
    (tmp_path / "job.toml").write_text(job)
    one = mpirun(1, "-m", "hilbert_hpc", "run", "job.toml", "-o", "one.h5", cwd=tmp_path)
    two = mpirun(2, "-m", "hilbert_hpc", "run", "job.toml", "-o", "two.h5", cwd=tmp_path)
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    with h5py.File(tmp_path / "one.h5") as a, h5py.File(tmp_path / "two.h5") as b:
        assert len(b["cases"]) == 4
        for cid in a["cases"]:
            out_a, out_b = a["cases"][cid]["output"][...], b["cases"][cid]["output"][...]
            assert out_a.shape == (1, 1024, 4, 16)
            assert np.abs(out_a - out_b).max() <= 1e-12 * np.abs(out_a).max()
            assert b["cases"][cid]["accuracy"].attrs["max_rel_err"] < 1e-12
