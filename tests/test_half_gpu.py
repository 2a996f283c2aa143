"""Backend "cuda" with 16-bit dtypes on a GPU with 16-bit tensor cores (wgmma16 on Hopper, mma16): the job path end to end against the PyTorch peer.

The float64 reference starts from the same rounded inputs; the FlashAttention rule: our max relative
error is at most twice the peer's on the same inputs.
"""

from __future__ import annotations

import os

import h5py
import pytest

from conftest import gpu_available
from jobtext import job_text

pytestmark = pytest.mark.gpu

JOB = job_text(name="half", repeats=1, warmup=1, accuracy_rows=96, defaults={"heads": 6, "backend": "torch"},
               cases=[{"name": "g", "grid": [48, 64], "patterns": [[256, 1], [1024, 2], [3072, 6]],
                       "ordering": "hilbert",
                       "sweep": {"dtype": ["bfloat16", "float16"], "head_dim": [64, 96, 128], "causal": [False, True],
                                 "backend": ["torch", "cuda"]}}])


def _hopper() -> bool:
    if not gpu_available():
        return False
    import cupy

    return int(cupy.cuda.Device().compute_capability) == 90


def _sm80() -> bool:
    if not gpu_available():
        return False
    import cupy

    return int(cupy.cuda.Device().compute_capability) >= 80


@pytest.mark.skipif(not _sm80(), reason="needs a GPU with 16-bit tensor cores (compute capability 8.0+)")
@pytest.mark.parametrize("variant", ["default", "wgmma16", "mma16"])
def test_cuda_backend_in_16_bits_matches_the_peer_rule(tmp_path, monkeypatch, variant):
    """Every 16-bit kernel: the default for this GPU (on Hopper tma16), wgmma16 and
    mma16 forced (mma16 is the default off Hopper)."""
    from hilbert_hpc.study.jobfile import load_job
    from hilbert_hpc.kernels.selection import SIXTEEN_BIT_ENV, choose
    from hilbert_hpc.distributed.mpi import SingleProcessComm
    from hilbert_hpc.study.runner import run_job

    if variant == "wgmma16" and not _hopper():
        pytest.skip("wgmma16 needs compute capability 9.0")
    if variant == "default":
        monkeypatch.delenv(SIXTEEN_BIT_ENV, raising=False)

        def expected(d: int) -> str:
            return choose("bfloat16", d, cc=90, override="").name if _hopper() else "mma16"
    else:
        monkeypatch.setenv(SIXTEEN_BIT_ENV, variant)

        def expected(d: int) -> str:
            return variant
    (tmp_path / "job.toml").write_text(JOB)
    path = run_job(load_job(tmp_path / "job.toml", world_size=1), str(tmp_path / "r.h5"),
                   comm=SingleProcessComm(), stream=open(os.devnull, "w"), progress=open(os.devnull, "w"))
    errors: dict[tuple, dict[str, float]] = {}
    with h5py.File(path) as f:
        for g in f["cases"].values():
            a = g.attrs
            acc = g["accuracy"].attrs
            assert acc["within_tolerance"] and acc["nonfinite"] == 0, dict(a)
            if a["backend"] == "cuda":
                assert a["kernel"] == expected(int(a["head_dim"]))
            errors.setdefault((a["dtype"], int(a["head_dim"]), bool(a["causal"])), {})[a["backend"]] = \
                float(acc["max_rel_err"])
    assert len(errors) == 12                        # dtype x head dim (64, 96, 128) x causal
    for key, e in errors.items():
        assert e["cuda"] <= 2 * e["torch"], (key, e)


@pytest.mark.skipif(not gpu_available() or _sm80(), reason="needs a GPU older than compute capability 8.0")
def test_cuda_backend_in_16_bits_elsewhere_is_one_clear_error(tmp_path):
    from hilbert_hpc.errors import ConfigError
    from hilbert_hpc.study.jobfile import load_job
    from hilbert_hpc.study.runner import check_case

    (tmp_path / "job.toml").write_text(JOB)
    case = next(c for c in load_job(tmp_path / "job.toml", world_size=1).cases if c.backend == "cuda")
    with pytest.raises(ConfigError, match="needs 16-bit tensor cores"):
        check_case(case)
