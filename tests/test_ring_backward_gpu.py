"""The ring backward on GPUs (pytest-mpi; several ranks may share one GPU): backends cuda-fp32 and cuda.

Each rank holds its shard as the study holds it (the backend's arrays, the ring's views of them), runs the
fused ring forward and the ring backward with the backend's providers (``ring_side``: the backward
kernels launched on the packed blocks in place) through the staged transport, and compares its gradients
(the side's ``gradients``: 16 bits rounded once) with its rows of the float64 single-rank backward of the whole
(rounded) sequence: float32 <= 1e-5 relative, 16 bits at the single-device 16-bit backward's 2e-2.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from hilbert_hpc.core.backward import local_dilated_backward
from hilbert_hpc.core.dilated import local_dilated_forward
from hilbert_hpc.core.inputs import random_rows
from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.core.precision import precision
from hilbert_hpc.distributed.ring import RingStats, ring_dilated_forward
from hilbert_hpc.distributed.ring_backward import ring_dilated_backward
from hilbert_hpc.distributed.sharding import Layout, check_distribution

from conftest import gpu_available  # noqa: E402
from jobtext import job_text

cupy = pytest.importorskip("cupy")
HAVE_GPU = gpu_available()

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.gpu,
              pytest.mark.skipif(not HAVE_GPU, reason="needs an NVIDIA GPU")]

#: (backend, dtype) and the gradients' tolerance against float64
CASES = {("cuda-fp32", "float32"): 1e-5, ("cuda", "bfloat16"): 2e-2}


def _sm80() -> bool:
    return HAVE_GPU and int(cupy.cuda.Device().compute_capability) >= 80


def _skip_unless_runs(dtype: str) -> None:
    if dtype != "float32" and not _sm80():
        pytest.skip("the 16-bit kernels need compute capability 8.0 or newer")


def ring_errors(backend: str, dtype: str, causal: bool, placement: str, schedule: str = "ring") -> dict[str, float]:
    """This rank's max relative error of dQ, dK, dV against its rows of the float64 single-rank backward (local,
    two-chunk and global patterns, Hilbert order, the staged transport); checks the gradients' dtype and the
    ring's counters on the way."""
    from mpi4py import MPI

    from hilbert_hpc.backends import find_backend
    from hilbert_hpc.distributed.mpi import bind_gpu
    from hilbert_hpc.distributed.transports import resolve_transport

    comm = MPI.COMM_WORLD
    bind_gpu(comm)
    rank, size = comm.Get_rank(), comm.Get_size()
    chunk, heads, d = 256, 4, 64
    n = 2 * size * chunk
    # local, a segment of two chunks (local on contiguous shards, a 2-rank ring in zigzag), global
    patterns = [Pattern(128, 1), Pattern(2 * chunk, 2), Pattern(n, 8)]
    check_distribution(n, size, patterns, placement=placement)
    grid = (n // 32, 32)
    layout = Layout(grid, "hilbert", size, placement=placement)
    scale = 1.0 / math.sqrt(d)
    be = find_backend(backend)
    host = [random_rows(5, t, layout.shard_natural(rank), heads, d, np.float64) for t in ("q", "k", "v", "do")]
    dev = [be.to_device(x, dtype) for x in host]
    side = be.ring_side(dtype, be.kernel_choice(d, dtype), be.backward_kernel_choice(d, dtype), backward=True)
    qs, ks, vs = (side.view(x) for x in dev[:3])
    transport, _ = resolve_transport("staged", True, comm)
    transport.chunk_bytes = 16384              # several chunks per block in the staged pipeline
    kept = {}
    out, lse = ring_dilated_forward(qs, ks, vs, patterns=patterns, comm=comm, causal=causal, scale=scale,
                                    transport=transport, kernels=side.forward,
                                    placement=placement, schedule=schedule, gathered=kept)
    out = side.output(out)
    stats = RingStats()
    kernels = side.backward
    grads = side.gradients(ring_dilated_backward(qs, ks, vs, out, lse, dev[3], patterns=patterns, comm=comm,
                                                    causal=causal, scale=scale, transport=transport,
                                                    kernels=kernels, stats=stats, placement=placement,
                                                    schedule=schedule, gathered=kept))
    be.synchronize()
    # a gathering rank whose rows no one else sees sends nothing in the backward (the first of a causal ring)
    assert (stats.ring_steps > 0) == (schedule == "ring") and comm.allreduce(stats.bytes_sent) > 0

    prec = precision(dtype)
    whole = [cupy.asarray(prec.round(random_rows(5, t, Layout(grid, "hilbert", 1).shard_natural(0), heads, d,
                                                 np.float64))) for t in ("q", "k", "v", "do")]
    w_out, w_lse = local_dilated_forward(*whole[:3], patterns, causal, scale)
    want = [cupy.asnumpy(w) for w in local_dilated_backward(*whole[:3], w_out, w_lse, whole[3], patterns, causal,
                                                             scale)]
    mine = layout.shards.serialized(rank)
    errors = {}
    for name, g, w in zip(("dq", "dk", "dv"), grads, want):
        got = be.to_numpy(g)
        assert str(g.dtype).removeprefix("torch.") == dtype, (name, g.dtype)     # as serialized_backward's
        assert got.shape == w[mine].shape and np.isfinite(got).all(), name
        errors[name] = float(np.abs(got.astype(np.float64) - w[mine]).max() / np.abs(w).max())
    return errors


@pytest.mark.parametrize("schedule", ["ring", "gather"])
@pytest.mark.parametrize("placement", ["contiguous", "zigzag"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backend,dtype", list(CASES))
def test_gpu_ring_backward_equals_single_rank_float64(backend, dtype, causal, placement, schedule):
    from mpi4py import MPI

    _skip_unless_runs(dtype)
    if MPI.COMM_WORLD.Get_size() % 2:
        pytest.skip("a segment of 2 zigzag chunks needs an even rank count")
    for name, err in ring_errors(backend, dtype, causal, placement, schedule).items():
        assert err <= CASES[backend, dtype], f"rank {MPI.COMM_WORLD.Get_rank()}: {name} relative error {err:.2e}"


def _study_job() -> str:
    """forward+backward on 1, 2, 4 ... ranks: cuda-fp32 in float32 and cuda in bfloat16, causal or not, staged."""
    case = {"grid": [32, 64], "ranks": "pow2", "ordering": "hilbert",
            "sweep": {"causal": [False, True], "long_schedule": ["gather", "ring"]},
            "patterns": [[256, 1], [1024, 2], ["N", "N/512"]]}
    return job_text(name="ringbwd-gpu", repeats=1, warmup=0, accuracy_rows=32, save_output=True,
                    defaults={"heads": 4, "head_dim": 64, "pass": "forward+backward", "transport": "staged"},
                    cases=[{"name": "fp32", "backend": "cuda-fp32", "dtype": "float32", **case},
                           {"name": "bf16", "backend": "cuda", "dtype": "bfloat16", **case}])


@pytest.mark.skipif(not _sm80(), reason="the 16-bit kernels need compute capability 8.0 or newer")
def test_study_forward_backward_on_several_gpu_ranks_matches_one_rank(tmp_path_factory):
    """pass = forward+backward on 1, 2 ... ranks of backends cuda-fp32 and cuda (float32, bfloat16): every case
    within its dtype's tolerance, the several-rank gradients as close to float64 as one rank's, the backward
    timed on every rank."""
    import io
    from pathlib import Path

    import h5py
    from mpi4py import MPI

    from hilbert_hpc.study.jobfile import load_job
    from hilbert_hpc.study.runner import run_job

    comm = MPI.COMM_WORLD
    tmp = Path(comm.bcast(str(tmp_path_factory.mktemp("ringbwdgpu")) if comm.Get_rank() == 0 else None))
    job = load_job(tmp / "job.toml", text=_study_job(), world_size=comm.Get_size())
    out = run_job(job, output=str(tmp / "r.h5"), stream=io.StringIO(), comm=comm, progress=io.StringIO())
    comm.Barrier()
    if comm.Get_rank() != 0:
        return
    groups: dict[tuple, list] = {}
    with h5py.File(out) as f:
        for g in f["cases"].values():
            a, acc = g.attrs, g["accuracy"].attrs
            assert a["complete"] and acc["within_tolerance"] and acc["nonfinite"] == 0, dict(a)
            assert (g["timings"]["backward"][()] > 0).all()
            errs = {t: float(acc[f"grad_{t}_max_rel_err"]) for t in "qkv"}
            groups.setdefault((str(a["backend"]), str(a["dtype"]), bool(a["causal"]), str(a["long_schedule"])),
                              []).append(
                (int(a["ranks"]), errs, {t: g[f"grad_{t}"][...] for t in "qkv"}))
    assert len(groups) == 2 * 2 * 2
    for (backend, dtype, causal, _), cases in groups.items():
        cases.sort(key=lambda c: c[0])
        assert [c[0] for c in cases] == [p for p in (1, 2, 4, 8) if p <= comm.Get_size()]
        _, errs1, grads1 = cases[0]
        for ranks, errs, grads in cases:
            for t in "qkv":
                assert errs[t] <= CASES[backend, dtype], (backend, dtype, causal, ranks, t, errs[t])
                if dtype == "float32":            # the same size (the sums run in another order)
                    assert errs[t] <= max(2 * errs1[t], 1e-6), (backend, causal, ranks, t, errs[t], errs1[t])
                diff = float(np.abs(grads[t].astype(np.float64) - grads1[t]).max() / np.abs(grads1[t]).max())
                assert diff <= (2e-2 if dtype == "bfloat16" else 1e-5), (backend, dtype, causal, ranks, t, diff)
