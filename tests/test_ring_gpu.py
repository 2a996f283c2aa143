"""The ring on GPUs (pytest-mpi, one GPU per rank): CuPy shards through each transport equal the CPU result."""

from __future__ import annotations

import numpy as np
import pytest

from hilbert_hpc.inputs import random_rows
from hilbert_hpc.patterns import Pattern
from hilbert_hpc.ring import RingStats, ring_dilated_attention
from hilbert_hpc.sharding import Layout

from conftest import gpu_available  # noqa: E402

cupy = pytest.importorskip("cupy")
HAVE_GPU = gpu_available()

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.gpu,
              pytest.mark.skipif(not HAVE_GPU, reason="needs an NVIDIA GPU")]


@pytest.mark.parametrize("transport_name", ["staged", "cuda-aware"])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_ring_equals_cpu_ring(transport_name, causal):
    from mpi4py import MPI

    from hilbert_hpc.cuda_aware import cuda_aware_support
    from hilbert_hpc.mpi import bind_gpu
    from hilbert_hpc.transports import resolve_transport

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
                                 stats=stats)
    assert isinstance(got, cupy.ndarray)
    err = float(np.abs(cupy.asnumpy(got) - want).max() / np.abs(want).max())
    assert err < 1e-12, f"rank {rank}: {err:.2e}"
    assert stats.ring_steps > 0
