"""The command line end to end: run a job, read the HDF5 file, info, errors without tracebacks."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest

from clirun import run_in_process
from jobtext import JobSpec

CLI_JOB = JobSpec({"name": "cli", "repeats": 2, "warmup": 0, "accuracy_rows": 8, "save_output": True},
                  defaults={"heads": 3, "head_dim": 16},
                  cases=[{"name": "g", "grid": [16, 16], "patterns": [[64, 1], [256, 8]],
                          "sweep": {"ordering": ["natural", "hilbert"], "backend": ["numpy", "torch"],
                                    "dtype": ["float32", "float64"]}}])
JOB = CLI_JOB.text()


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_in_process(args, cwd)


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


def test_cases_of_optional_backends_that_cannot_run_here_are_left_out(tmp_path, monkeypatch):
    """job.optional_backends: a peer that cannot run on this machine (here 'flash' with a stand-in reason) is
    left out with one note per backend; with no other case the run is refused in one line."""
    from hilbert_hpc.backends.flash_peer import FlashPeer
    from hilbert_hpc.study.jobfile import load_job
    from hilbert_hpc.study.setup import runnable_here

    base = {"name": "g", "grid": [16, 16], "patterns": [[64, 1], [256, 8]]}
    text = CLI_JOB.but(optional_backends=["flash"], cases=[{**base, "backend": "numpy", "dtype": "float32"},
                                                           {**base, "backend": "flash", "dtype": "bfloat16"}]).text()
    job = load_job("job.toml", text=text, world_size=1)
    assert job.optional_backends == ("flash",) and len(job.cases) == 2
    monkeypatch.setattr(FlashPeer, "usable", lambda self: "no FlashAttention-4 here")
    kept, notes = runnable_here(job)
    assert [c.backend for c in kept.cases] == ["numpy"]
    assert notes == ["backend 'flash' cannot run here (no FlashAttention-4 here): its 1 case(s) are left out "
                     "(job.optional_backends)"]
    monkeypatch.setattr(FlashPeer, "usable", lambda self: None)
    assert runnable_here(job) == (job, [])
    monkeypatch.undo()
    if FlashPeer().usable() is None:
        return                        # FlashAttention-4 runs here: the command-line part needs a machine without
    (tmp_path / "job.toml").write_text(text)
    res = cli("run", "job.toml", "-o", "out.h5", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "note: backend 'flash' cannot run here" in res.stderr
    with h5py.File(tmp_path / "out.h5") as f:
        assert [g.attrs["backend"] for g in f["cases"].values()] == ["numpy"]
    only = CLI_JOB.but(optional_backends=["flash"], cases=[{**base, "backend": "flash", "dtype": "bfloat16"}])
    (tmp_path / "only.toml").write_text(only.text())
    res = cli("run", "only.toml", "-o", "only.h5", cwd=tmp_path)
    assert res.returncode == 2 and "job.optional_backends" in res.stderr and "Traceback" not in res.stderr
    bad = CLI_JOB.but(optional_backends=["flashy"])
    (tmp_path / "bad.toml").write_text(bad.text())
    res = cli("run", "bad.toml", "-o", "bad.h5", cwd=tmp_path)
    assert res.returncode == 2 and "job.optional_backends[0]" in res.stderr
