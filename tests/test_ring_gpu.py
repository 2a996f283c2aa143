"""The ring on GPUs (pytest-mpi, one GPU per rank): CuPy shards through each transport equal the CPU result."""

from __future__ import annotations

import numpy as np
import pytest

from hilbert_hpc.core.inputs import random_rows
from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.distributed.ring import RingStats, ring_dilated_attention
from hilbert_hpc.distributed.sharding import Layout

from conftest import gpu_available  # noqa: E402
from jobtext import job_text

cupy = pytest.importorskip("cupy")
HAVE_GPU = gpu_available()

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.gpu,
              pytest.mark.skipif(not HAVE_GPU, reason="needs an NVIDIA GPU")]


@pytest.mark.parametrize("schedule", ["ring", "gather"])
@pytest.mark.parametrize("transport_name", ["staged", "cuda-aware"])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_ring_equals_cpu_ring(transport_name, causal, schedule):
    from mpi4py import MPI

    from hilbert_hpc.distributed.cuda_aware import cuda_aware_support
    from hilbert_hpc.distributed.mpi import bind_gpu
    from hilbert_hpc.distributed.transports import resolve_transport

    if transport_name == "cuda-aware" and not cuda_aware_support()[0]:
        pytest.skip("the MPI library is not known to be CUDA-aware (see hilbert-hpc cuda-env)")
    comm = MPI.COMM_WORLD
    bind_gpu(comm)
    rank, size = comm.Get_rank(), comm.Get_size()
    shard, heads, d = 512, 6, 32
    n = shard * size
    patterns = [Pattern(256, 2), Pattern(n // 2 if size >= 4 else n, 4), Pattern(n, 8)]
    layout = Layout((n // 32, 32), "hilbert", size)
    nat = layout.shard_natural(rank)
    host = [random_rows(5, t, nat, heads, d, np.float64) for t in ("q", "k", "v")]
    want = ring_dilated_attention(*host, patterns=patterns, comm=comm, causal=causal)
    transport, _ = resolve_transport(transport_name, True, comm)
    transport.chunk_bytes = 4096  # several chunks per block in the staged pipeline
    stats = RingStats()
    dev = [cupy.asarray(x) for x in host]
    got = ring_dilated_attention(*dev, patterns=patterns, comm=comm, causal=causal, transport=transport,
                                 stats=stats, schedule=schedule)
    assert isinstance(got, cupy.ndarray)
    err = float(np.abs(cupy.asnumpy(got) - want).max() / np.abs(want).max())
    assert err < 1e-12, f"rank {rank}: {err:.2e} ({schedule})"
    assert (stats.ring_steps > 0) == (schedule == "ring")


def _ring_job(transports: list[str]) -> str:
    """The fused ring job on every rank count, each dtype and causality, over ``transports``."""
    return job_text(name="ring-fused", repeats=1, warmup=0, accuracy_rows=64, save_output=True,
                    defaults={"heads": 6, "head_dim": 64, "backend": "cuda"},
                    cases=[{"name": "g", "grid": [32, 64], "ranks": "pow2", "ordering": "hilbert",
                            "patterns": [[256, 1], [1024, 2], ["N", "N/512"]],
                            "sweep": {"dtype": ["float32", "bfloat16", "float16"], "causal": [False, True],
                                      "transport": ["staged", *transports], "long_schedule": ["gather", "ring"]}}])


def _sm80() -> bool:
    return HAVE_GPU and int(cupy.cuda.Device().compute_capability) >= 80


@pytest.mark.skipif(not _sm80(), reason="the 16-bit kernels need compute capability 8.0 or newer")
@pytest.mark.parametrize("half_kernel", ["default", "mma16"])
def test_fused_ring_in_every_dtype_agrees_with_one_gpu(tmp_path_factory, monkeypatch, half_kernel):
    """Backend cuda around the ring (float32, bfloat16, float16; both transports; the GPU's default 16-bit
    kernel and mma16, the default off Hopper): each case on 2, 4 ... GPUs is within its dtype's tolerance of
    float64, no more than twice the one-GPU error (16 bits: the output is rounded once per merge, and the
    ring merges more often), and close to the one-GPU output."""
    import io
    from pathlib import Path

    import h5py
    from mpi4py import MPI

    from hilbert_hpc.distributed.cuda_aware import cuda_aware_support
    from hilbert_hpc.study.jobfile import load_job
    from hilbert_hpc.core.precision import precision
    from hilbert_hpc.study.runner import run_job

    from hilbert_hpc.kernels.selection import SIXTEEN_BIT_ENV

    if half_kernel == "default":
        monkeypatch.delenv(SIXTEEN_BIT_ENV, raising=False)
    else:
        monkeypatch.setenv(SIXTEEN_BIT_ENV, half_kernel)
    comm = MPI.COMM_WORLD
    tmp = Path(comm.bcast(str(tmp_path_factory.mktemp("ring16")) if comm.Get_rank() == 0 else None))
    second = "cuda-aware" if cuda_aware_support()[0] else "staged"
    text = _ring_job([] if second == "staged" else ["cuda-aware"])
    job = load_job(tmp / "ring.toml", text=text, world_size=comm.Get_size())
    out = run_job(job, output=str(tmp / "r.h5"), stream=io.StringIO(), comm=comm, progress=io.StringIO())
    comm.Barrier()
    if comm.Get_rank() != 0:
        return
    groups: dict[tuple, dict[int, list]] = {}
    with h5py.File(out) as f:
        for g in f["cases"].values():
            a, acc = g.attrs, g["accuracy"].attrs
            assert g.attrs["complete"] and acc["within_tolerance"] and acc["nonfinite"] == 0, dict(a)
            key = (str(a["dtype"]), bool(a["causal"]), str(a["long_schedule"]))
            groups.setdefault(key, {}).setdefault(int(a["ranks"]), []).append(
                (str(a["transport"]), float(acc["max_rel_err"]), g["output"][...]))
    assert len(groups) == 3 * 2 * 2
    transports = 2 if second == "cuda-aware" else 1
    for (dtype, causal, _), by_ranks in groups.items():
        assert sorted(by_ranks) == [p for p in (1, 2, 4, 8) if p <= comm.Get_size()]
        assert all(len(cases) == transports for cases in by_ranks.values())
        err1 = max(err for _, err, _ in by_ranks[1])
        out1 = by_ranks[1][0][2]
        tol = precision(dtype).tolerance
        for ranks, cases in by_ranks.items():
            for transport, err, output in cases:
                assert ranks == 1 or transport in ("staged", "cuda-aware"), transport
                assert err <= max(2 * err1, 1e-6), (dtype, causal, transport, ranks, err, err1)
                diff = float(np.abs(output.astype(np.float64) - out1).max() / np.abs(out1).max())
                assert diff <= (tol if precision(dtype).sixteen_bit else 1e-6), (dtype, causal, transport, ranks, diff)
