"""The command line end to end: run a job, read the HDF5 file, info, errors without tracebacks."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from jobtext import JobSpec

ROOT = Path(__file__).resolve().parents[1]

CLI_JOB = JobSpec({"name": "cli", "repeats": 2, "warmup": 0, "accuracy_rows": 8, "save_output": True},
                  defaults={"heads": 3, "head_dim": 16},
                  cases=[{"name": "g", "grid": [16, 16], "patterns": [[64, 1], [256, 8]],
                          "sweep": {"ordering": ["natural", "hilbert"], "backend": ["numpy", "torch"],
                                    "dtype": ["float32", "float64"]}}])
JOB = CLI_JOB.text()


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "hilbert_hpc", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240)


def test_run_writes_a_self_describing_results_file(tmp_path):
    (tmp_path / "job.toml").write_text(JOB)
    res = cli("run", "job.toml", "-o", "out.h5", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "GFLOP/s" in res.stdout and len(re.findall(r"^\d{4}-g ", res.stdout, re.M)) == 8
    from dense_reference import dense_dilated_attention
    from hilbert_hpc import serialization_order
    from hilbert_hpc.core.inputs import random_rows

    with h5py.File(tmp_path / "out.h5") as f:
        assert f.attrs["program"] == "hilbert-hpc"
        assert "numpy" in json.loads(f.attrs["versions"])
        assert f.attrs["job_text"] == JOB
        cases = f["cases"]
        assert len(cases) == 8
        for cid, g in cases.items():
            assert g.attrs["complete"]
            assert g["timings/attention"].shape == (1, 2) and g["timings/attention"].attrs["units"] == "s"
            assert np.all(g["timings/attention"][()] > 0)
            assert g.attrs["heads"] == 3 and list(g.attrs["grid"]) == [16, 16]
            out = g["output"][()]
            assert out.shape == (1, 256, 3, 16)
            q, k, v = (random_rows(2026, t, np.arange(256), 3, 16, g.attrs["dtype"]) for t in "qkv")
            perm = serialization_order((16, 16), g.attrs["ordering"])
            ref = dense_dilated_attention(q, k, v, [(64, 1), (256, 8)], False, perm)
            tol = 1e-12 if g.attrs["dtype"] == "float64" else 1e-5
            assert np.linalg.norm(out[0] - ref) / np.linalg.norm(ref) < tol, cid
            assert g["accuracy"].attrs["max_rel_err"] < tol * 10
            assert g["metrics"].attrs["useful_tflops"] > 0


def test_bad_job_gives_one_line_and_exit_code_2(tmp_path):
    (tmp_path / "job.toml").write_text(CLI_JOB.but(case={"patterns": [[64, 1], [100, 4]]}).text())
    res = cli("run", "job.toml", "-o", "out.h5", cwd=tmp_path)
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert res.stderr.strip().count("\n") == 0
    assert "cases[0].patterns[1]" in res.stderr and "does not divide" in res.stderr
    assert not (tmp_path / "out.h5").exists()


def test_info_prints_the_environment(tmp_path):
    res = cli("info", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "cpu:" in res.stdout and "mpi:" in res.stdout and "numpy" in res.stdout


@pytest.mark.parametrize("args", [["run"], ["frobnicate"]])
def test_usage_errors_exit_2(tmp_path, args):
    res = cli(*args, cwd=tmp_path)
    assert res.returncode == 2 and "usage:" in res.stderr
