"""16-bit dtypes (bfloat16, float16): job validation, the PyTorch peer end to end, outputs and accuracy."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import ml_dtypes
import numpy as np
import pytest

from hilbert_hpc.errors import JobFileError
from hilbert_hpc.study.jobfile import load_job
from hilbert_hpc.core.precision import PRECISIONS, precision

from jobtext import JobSpec

P16_JOB = JobSpec({"name": "p16", "repeats": 1, "warmup": 0, "accuracy_rows": 64, "save_output": True},
                  defaults={"heads": 3, "head_dim": 16, "backend": "torch"},
                  cases=[{"name": "g", "grid": [16, 32], "patterns": [[128, 1], [512, 4]], "ordering": "hilbert",
                          "sweep": {"dtype": ["bfloat16", "float16", "float32"], "causal": [False, True]}}])


def _job(tmp_path: Path, text: str = P16_JOB.text()):
    (tmp_path / "job.toml").write_text(text)
    return load_job(tmp_path / "job.toml", world_size=1)


def _dtypes(dtypes: list[str], backend: str) -> str:
    """P16_JOB on ``backend`` sweeping ``dtypes``."""
    return P16_JOB.but(defaults={"backend": backend},
                       case={"sweep": {"dtype": dtypes, "causal": [False, True]}}).text()


@pytest.mark.parametrize("backend", ["numpy", "cupy", "cuda-fp32"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_backends_without_16_bit_paths_are_refused_naming_both(tmp_path, backend, dtype):
    text = _dtypes([dtype], backend)
    with pytest.raises(JobFileError) as err:
        _job(tmp_path, text)
    assert err.value.param == "cases[0].dtype"
    assert f"backend {backend!r} does not compute in {dtype}" in err.value.message
    assert "runs on backend torch or flash or cuda" in err.value.message


def test_float64_on_the_fp32_kernels_is_refused_at_validation(tmp_path):
    text = _dtypes(["float64"], "cuda-fp32")
    with pytest.raises(JobFileError, match="backend 'cuda-fp32' does not compute in float64"):
        _job(tmp_path, text)


def test_unknown_dtype_lists_the_choices(tmp_path):
    with pytest.raises(JobFileError, match="expected one of float64, float32, bfloat16, float16"):
        _job(tmp_path, _dtypes(["bfloat16", "float16", "float8"], "torch"))


def test_precision_rounds_to_nearest_even():
    bf16 = precision("bfloat16")
    # 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to the even one (1)
    assert bf16.round(np.float32([1 + 2 ** -8, 1 + 3 * 2 ** -8])).tolist() == [1.0, 1 + 2 ** -6]
    assert precision("float16").round(np.float32([65520.0])).tolist() == [np.inf]
    assert bf16.host_dtype() == np.dtype(ml_dtypes.bfloat16) and bf16.itemsize == 2
    assert {p.file_dtype for p in PRECISIONS.values()} <= {"float64", "float32", "float16"}


def test_peer_in_16_bits_end_to_end(tmp_path):
    """bf16/fp16 cases of the peer: outputs in the dtype (bf16 saved exactly as float32), accuracy against
    float64 from the same rounded inputs, within tolerance and at the level the dtype predicts."""
    from hilbert_hpc.distributed.mpi import SingleProcessComm
    from hilbert_hpc.study.runner import run_job

    path = run_job(_job(tmp_path), str(tmp_path / "r.h5"), comm=SingleProcessComm(),
                   stream=open(os.devnull, "w"), progress=open(os.devnull, "w"))
    with h5py.File(path) as f:
        seen = set()
        for g in f["cases"].values():
            dtype = g.attrs["dtype"]
            seen.add(dtype)
            acc = g["accuracy"].attrs
            out = g["output"][...]
            assert acc["within_tolerance"] and acc["nonfinite"] == 0 and acc["rows"] == 64
            assert out.dtype == np.dtype(precision(dtype).file_dtype)
            if dtype == "bfloat16":
                assert np.array_equal(out, precision("bfloat16").round(out))      # values are bf16 values
                assert 1e-4 < acc["max_rel_err"] < 1e-2        # bf16 output rounding, not float32 accuracy
            elif dtype == "float16":
                assert 1e-5 < acc["max_rel_err"] < 2e-3
            else:
                assert acc["max_rel_err"] < 1e-5
        assert seen == {"bfloat16", "float16", "float32"}


def test_plan_counts_two_bytes_per_element(tmp_path):
    from hilbert_hpc.study.plan import estimate

    job = _job(tmp_path, P16_JOB.but(case={"grid": [1024, 1024]}).text())
    by_dtype = {c.dtype: estimate(c).floor_bytes for c in job.cases if not c.causal}
    assert by_dtype["bfloat16"] == by_dtype["float16"] < by_dtype["float32"]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
def test_redistribute_moves_16bit_rows_by_their_bits(dtype):
    """Neither bfloat16 nor float16 has an MPI datatype: their rows travel as 16-bit integers."""
    from mpi4py import MPI

    from hilbert_hpc.distributed.datafile import redistribute

    comm = MPI.COMM_WORLD
    rank, ranks, shard = comm.Get_rank(), comm.Get_size(), 8
    total = shard * ranks
    rng = np.random.default_rng(5)
    everything = rng.standard_normal((total, 2, 4)).astype(np.float32).astype(dtype)
    targets = rng.permutation(total)                  # row i goes to position targets[i]
    mine = slice(rank * shard, (rank + 1) * shard)
    got = redistribute(everything[mine], targets[mine], shard, comm)
    expected = np.empty_like(everything)
    expected[targets] = everything
    assert got.dtype == np.dtype(dtype)
    assert np.array_equal(got.view(np.uint16), expected[mine].view(np.uint16))


@pytest.mark.parametrize("chunk", [7, 1 << 24])
def test_nonfinite_count_is_exact_in_chunks(monkeypatch, chunk):
    """Every NaN/Inf is counted, whatever the chunking, for NumPy arrays and torch tensors (bf16 included)."""
    torch = pytest.importorskip("torch")
    from hilbert_hpc.core import arrays

    monkeypatch.setattr(arrays, "NONFINITE_CHUNK", chunk)
    x = np.arange(120, dtype=np.float32).reshape(4, 5, 6)
    x[0, 0, 0], x[1, 3, 5], x[3, 4, 5] = np.nan, np.inf, -np.inf
    assert arrays.count_nonfinite(x) == 3
    assert arrays.count_nonfinite(torch.from_numpy(x)) == 3
    assert arrays.count_nonfinite(torch.from_numpy(x).to(torch.bfloat16)) == 3
    assert arrays.count_nonfinite(x[:, :2]) == 1 and arrays.count_nonfinite(np.zeros((0, 3))) == 0
    assert arrays.count_nonfinite(x.transpose(2, 0, 1)) == 3 and arrays.count_nonfinite(np.float32(np.nan)) == 1
    assert arrays.count_nonfinite(torch.from_numpy(x).transpose(0, 2)) == 3
