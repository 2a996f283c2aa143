"""``mpiexec -n 8 --oversubscribe hilbert-hpc run``: outputs and gradients of local, long and global patterns,
causal or not, in the Hilbert order, exact against float64 on eight ranks, in both placements and both long-pattern
schedules; every rank's useful FLOPs recorded (balanced by zigzag, the causal default)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from jobtext import JobSpec

from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.core.work import imbalance, rank_useful_flops

ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = shutil.which("mpiexec")
RANKS = 8
#: 256 tokens, 32 a rank: (32, 1) stays on each rank, (128, 4) rings over 4 ranks, (256, 8) over all 8
PATTERNS = [[32, 1], [128, 4], [256, 8]]
JOB = JobSpec({"name": "eight", "repeats": 1, "warmup": 0, "accuracy_rows": 24},
              defaults={"heads": 3, "head_dim": 8, "dtype": "float64", "backend": "numpy",
                        "pass": "forward+backward", "ordering": "hilbert"},
              cases=[{"name": "lg", "grid": [16, 16], "ranks": RANKS, "patterns": PATTERNS,
                      "sweep": {"causal": [False, True], "long_schedule": ["gather", "ring"]}},
                     {"name": "lgc", "grid": [16, 16], "ranks": RANKS, "patterns": PATTERNS, "causal": True,
                      "placement": "contiguous", "sweep": {"long_schedule": ["gather", "ring"]}}])
ERRORS = ["max_rel_err", "rel_l2_err"] + [f"grad_{t}_{e}" for t in "qkv" for e in ("max_rel_err", "rel_l2_err")]


@pytest.mark.skipif(MPIEXEC is None, reason="needs mpiexec on PATH")
def test_eight_ranks_forward_backward_exact_in_float64(tmp_path):
    (tmp_path / "job.toml").write_text(JOB.text())
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1", HILBERT_HPC_THREADS="1")
    cmd = [MPIEXEC, "-n", str(RANKS), "--oversubscribe", sys.executable, "-m", "hilbert_hpc", "run", "job.toml",
           "-o", "r.h5"]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    with h5py.File(tmp_path / "r.h5") as f:
        cases = list(f["cases"].values())
        used = sorted((bool(g.attrs["causal"]), g.attrs["placement"], g.attrs["long_schedule"]) for g in cases)
        assert used == [(c, p, s) for c, p in [(False, "contiguous"), (True, "contiguous"), (True, "zigzag")]
                        for s in ("gather", "ring")]
        for g in cases:                   # each long pattern ran the schedule its case asked for
            kinds = {d.rsplit(": ", 1)[1] for d in str(g.attrs["long_schedules"]).split("; ")}
            assert kinds == {g.attrs["long_schedule"]}, g.attrs["long_schedules"]
        for g in cases:
            causal, placement = bool(g.attrs["causal"]), g.attrs["placement"]
            assert g.attrs["ranks"] == RANKS and g.attrs["pass"] == "forward+backward"
            acc = g["accuracy"].attrs
            assert acc["within_tolerance"] and acc["nonfinite"] == 0 and acc["selected_pairs"] > 0
            for name in ERRORS:
                assert 0 <= acc[name] <= 1e-12, (causal, name, acc[name])
            flops = g["timings"]["useful_flops"][()]
            want = rank_useful_flops(256, RANKS, 3, 8, [Pattern(*p) for p in PATTERNS], causal, placement=placement)
            assert flops.shape == (RANKS, 1) and flops[:, 0].tolist() == want
            assert g["metrics"].attrs["flops_imbalance"] == pytest.approx(imbalance(want))
            assert (g["metrics"].attrs["flops_imbalance"] > 1.0) == (placement == "contiguous" and causal)
            assert np.isfinite(g["metrics"].attrs["backward_imbalance"])
