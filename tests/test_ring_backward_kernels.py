"""The ring backward's kernel provider (hilbert_hpc.kernels.backward.RingBackwardKernels), on the CPU.

``numpy_backward_launch`` does what one backward launch does, in float64 NumPy, straight from the kernels'
contract (``DILATED_BWD_PARAMS``, docs/semantics.md section 10: terms added into float32 dQ, dK, dV); with it
in place of the GPU launch, the provider's local patterns and its packed ring blocks (pytest-mpi: contiguous
and zigzag rings, the accumulators' dK/dV written into the travelling block) must give the single-rank
gradients, so the geometry the GPU kernels receive is checked without a GPU. 16-bit inputs are the raw
bfloat16 bits the ring holds (int16 arrays).
"""

from __future__ import annotations

import numpy as np
import pytest

from hilbert_hpc.core.backward import local_dilated_backward
from hilbert_hpc.core.dilated import local_dilated_forward
from hilbert_hpc.core.inputs import random_rows
from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.distributed.ring import ring_dilated_forward
from hilbert_hpc.distributed.ring_backward import ring_dilated_backward
from hilbert_hpc.distributed.sharding import Layout, check_distribution
from hilbert_hpc.kernels.backward import BackwardKernels, RingBackwardKernels
from hilbert_hpc.kernels.selection import choose_backward

D = 32


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float values rounded to bfloat16 (nearest even), as int16 bits."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).view(np.int16)


def values(x: np.ndarray) -> np.ndarray:
    """float64 values of an array: int16 arrays hold bfloat16 bits."""
    if x.dtype == np.int16:
        return (x.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return x.astype(np.float64)


def numpy_backward_launch(q, k, v, dout, lse, delta, dq, dk, dv, *, qg, kg, vg, lg, segments, heads, mq, mk,
                          shift, scale, head_dim, follows=False, fresh=False):
    """One backward launch: for each (segment, head) problem, rows at base + seg*segment + head*h + i*row (dO
    and dQ like Q, dK like K, dV like V, delta like L); query i sees key j < mk (and j <= i + shift when shift
    is not None) with P = exp(scale q k - L); dQ, dK, dV (float32) get this problem's terms added (``fresh``: dK
    and dV stored). Returns whether there was anything to launch, as the kernels' launcher does (``follows``
    changes nothing here)."""
    qf, kf, vf, of = (values(x.reshape(-1)) for x in (q, k, v, dout))
    lf, df = lse.reshape(-1), delta.reshape(-1)
    dqf, dkf, dvf = (x.reshape(-1) for x in (dq, dk, dv))
    assert all(x.dtype == np.float32 and np.shares_memory(x, y) for x, y in ((dqf, dq), (dkf, dk), (dvf, dv)))
    cols = np.arange(head_dim)
    for s in range(segments):
        for h in range(heads):
            def rows(g, m):
                return (g[0] + s * g[1] + h * g[2] + g[3] * np.arange(m))[:, None] + cols

            qi, ki, vi = rows(qg, mq), rows(kg, mk), rows(vg, mk)
            li = lg[0] + s * lg[1] + h * lg[2] + lg[3] * np.arange(mq)
            L = lf[li].astype(np.float64)
            seen = np.ones((mq, mk), dtype=bool) & np.isfinite(L)[:, None]
            if shift is not None:
                seen &= np.arange(mk)[None, :] <= np.arange(mq)[:, None] + shift
            scores = qf[qi] @ kf[ki].T * scale
            p = np.where(seen, np.exp(np.where(seen, scores - np.where(np.isfinite(L), L, 0)[:, None], 0)), 0)
            ds = p * (of[qi] @ vf[vi].T - df[li][:, None])
            if fresh:
                dvf[vi] = 0.0
                dkf[ki] = 0.0
            dvf[vi] += (p.T @ of[qi]).astype(np.float32)
            dqf[qi] += (scale * ds @ kf[ki]).astype(np.float32)
            dkf[ki] += (scale * ds.T @ qf[qi]).astype(np.float32)
    return segments > 0 and heads > 0 and mq > 0 and mk > 0


def provider(dtype: str) -> RingBackwardKernels:
    """The provider of a Hopper backward choice for ``dtype``, launching :func:`numpy_backward_launch`."""
    kernels = BackwardKernels(choose_backward(dtype, D, cc=90, override=""))
    kernels.launch = numpy_backward_launch
    return RingBackwardKernels(kernels)


def _inputs(positions: np.ndarray, heads: int, dtype: str) -> list[np.ndarray]:
    """Q, K, V, dO rows as the provider holds them: float32, or bfloat16 bits."""
    rows = [random_rows(3, t, positions, heads, D, np.float64) for t in ("q", "k", "v", "do")]
    return [bf16_bits(x) if dtype == "bfloat16" else x.astype(np.float32) for x in rows]


def _held(x: np.ndarray, dtype: str) -> np.ndarray:
    return bf16_bits(x) if dtype == "bfloat16" else x.astype(np.float32)


def max_rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_row_delta_is_the_float32_rowsum_of_the_real_values(dtype, monkeypatch):
    import hilbert_hpc.kernels.backward as backward

    monkeypatch.setattr(backward, "ROW_DOT_CHUNK", 3 * 4 * D)          # several chunks of rows
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((10, 4, D)) for _ in range(2))
    if dtype == "bfloat16":
        held = [bf16_bits(x) for x in (a, b)]
        real = [values(x) for x in held]
    elif dtype == "float16":
        real = [x.astype(np.float16).astype(np.float64) for x in (a, b)]
        held = [x.astype(np.float16).view(np.int16) for x in (a, b)]
    else:
        held = [x.astype(np.float32) for x in (a, b)]
        real = [x.astype(np.float64) for x in held]
    got = RingBackwardKernels(BackwardKernels(choose_backward(dtype, D, cc=90, override=""))).row_delta(*held)
    assert got.dtype == np.float32 and got.shape == (10, 4)
    assert max_rel(got, np.einsum("nhd,nhd->nh", *real)) <= 1e-6


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
def test_local_backward_equals_the_exact_backward(dtype, causal):
    n, heads = 128, 4
    patterns = [Pattern(16, 1), Pattern(64, 2), Pattern(128, 4)]
    q, k, v, do = _inputs(np.arange(n), heads, dtype)
    real = [values(x) for x in (q, k, v, do)]
    scale = D ** -0.5
    out, lse = local_dilated_forward(*real[:3], patterns, causal, scale)
    out_held = _held(out, dtype)
    want = local_dilated_backward(*real[:3], values(out_held), lse, real[3], patterns, causal, scale)
    kernels = provider(dtype)
    lse32 = lse.astype(np.float32)
    delta = kernels.row_delta(do, out_held)
    got = kernels.local_backward(q, k, v, out_held, lse32, do, delta, patterns, causal, scale)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert g.dtype == np.float32 and g.shape == w.shape
        assert max_rel(g, w) <= 1e-5, name
    none = kernels.local_backward(q, k, v, out_held, lse32, do, delta, [], causal, scale)
    assert all(g.dtype == np.float32 and not g.any() for g in none)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("placement", ["contiguous", "zigzag"])
@pytest.mark.parametrize("schedule", ["ring", "gather"])
@pytest.mark.parametrize("global_dilation", [2, 4])
def test_ring_blocks_give_the_single_rank_gradients(global_dilation, schedule, placement, causal, dtype):
    """Local, two-chunk and global patterns, Hilbert order: the provider's ring blocks (dQ in the shard, dK/dV in
    the accumulator block) give every rank its rows of the single-rank float64 gradients (the same rounded
    inputs and output). A global dilation of 4 >= 3 heads: one head an offset, the offsets in one launch."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    chunk, heads = 32, 3
    n = 2 * size * chunk
    patterns = [Pattern(16, 2), Pattern(2 * chunk, 4), Pattern(n, global_dilation)]
    if size % 2:
        pytest.skip("a segment of 2 zigzag chunks needs an even rank count")
    check_distribution(n, size, patterns, placement=placement)
    grid = (n // 8, 8)
    layout = Layout(grid, "hilbert", size, placement=placement)
    scale = D ** -0.5
    q, k, v, do = _inputs(layout.shard_natural(rank), heads, dtype)
    real = [values(x) for x in (q, k, v)]
    out, lse = ring_dilated_forward(*real, patterns=patterns, comm=comm, causal=causal, scale=scale,
                                    placement=placement)
    out_held = _held(out, dtype)
    got = ring_dilated_backward(q, k, v, out_held, lse.astype(np.float32), do, patterns=patterns, comm=comm,
                                causal=causal, scale=scale, kernels=provider(dtype), placement=placement,
                                schedule=schedule)

    whole = [values(x) for x in _inputs(Layout(grid, "hilbert", 1).shard_natural(0), heads, dtype)]
    w_out, w_lse = local_dilated_forward(*whole[:3], patterns, causal, scale)
    w_out = values(_held(w_out, dtype))                               # the output as the ring holds it
    want = local_dilated_backward(*whole[:3], w_out, w_lse, whole[3], patterns, causal, scale)
    mine = layout.shards.serialized(rank)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert g.dtype == np.float32
        err = float(np.abs(g - w[mine]).max() / np.abs(w).max())
        assert err <= 1e-5, f"rank {rank}: {name} relative error {err:.2e}"
