"""The geometry of the fused kernels (hilbert_hpc.kernels.launch.FusedKernels), on the CPU.

Every fused kernel (FP32 and 16-bit, local patterns and packed ring blocks) takes the same element-offset
geometry and merges in place. ``numpy_launch`` does what one launch does, in float64 NumPy, straight from
the kernels' contract (docs/kernels.md); with it, FusedKernels must reproduce the unfused computation on
one rank and around the ring (pytest-mpi), so the geometry the GPU kernels receive is checked without a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest

from hilbert_hpc.core.dilated import local_dilated_attention
from hilbert_hpc.kernels.launch import FusedKernels
from hilbert_hpc.core.inputs import random_rows
from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.distributed.ring import ring_dilated_attention
from hilbert_hpc.distributed.sharding import Layout, check_distribution


def numpy_launch(q, k, v, out, lse, *, qg, kg, vg, lg, segments, heads, mq, mk, shift, scale, head_dim, og=None,
                 accumulate=False, final=None, final_out=None):
    """One fused launch: for each (segment, head) problem, rows at base + seg*segment + head*h + i*row;
    query i sees key j < mk (and j <= i + shift when shift is not None); the result merges by log-sum-exp
    into out (rows of q's geometry, or of og when given: tma16's float32 running output) and lse (lg); rows
    with no visible key stay untouched. With ``final`` (tma16's FinalRows) a row that no later pattern selects
    (sequence row i, head h of its element offset in the (n, H, D) output: i < end and i = h mod r for none of
    ``final.later``) goes to ``final_out`` at ``final.geometry`` instead of ``out``."""
    qf, kf, vf, of, lf = (x.reshape(-1) for x in (q, k, v, out, lse))
    ff = None if final is None else final_out.reshape(-1)
    assert np.shares_memory(of, out) and np.shares_memory(lf, lse)
    cols = np.arange(head_dim)
    for s in range(segments):
        for h in range(heads):
            def rows(g, m):
                return (g[0] + s * g[1] + h * g[2] + g[3] * np.arange(m))[:, None] + cols

            qi, ki, vi, oi = rows(qg, mq), rows(kg, mk), rows(vg, mk), rows(qg if og is None else og, mq)
            li = lg[0] + s * lg[1] + h * lg[2] + lg[3] * np.arange(mq)
            scores = qf[qi] @ kf[ki].T * scale
            if shift is not None:
                scores = np.where(np.arange(mk)[None, :] <= np.arange(mq)[:, None] + shift, scores, -np.inf)
            mx = scores.max(axis=1)
            seen = np.isfinite(mx)
            p = np.exp(scores[seen] - mx[seen, None])
            part = p @ vf[vi] / p.sum(axis=1, keepdims=True)
            part_lse = mx[seen] + np.log(p.sum(axis=1))
            old = lf[li[seen]]
            top = np.maximum(old, part_lse)
            wa = np.where(np.isneginf(old), 0.0, np.exp(old - top))
            wb = np.exp(part_lse - top)
            prev = np.where(np.isneginf(old)[:, None], 0.0, of[oi[seen]])
            merged = (prev * wa[:, None] + part * wb[:, None]) / (wa + wb)[:, None]
            lf[li[seen]] = top + np.log(wa + wb)
            if final is None:
                of[oi[seen]] = merged
                continue
            fi = rows(final.geometry, mq)[seen]
            i, hd = fi[:, 0] // final.row, fi[:, 0] % final.row // head_dim
            again = np.zeros(len(fi), dtype=bool)
            for r, end in final.later:
                again |= (i < end) & ((i - hd) % r == 0)
            of[oi[seen][again]] = merged[again]
            ff[fi[~again]] = merged[~again]


KERNELS = FusedKernels(numpy_launch)


def _inputs(n: int, heads: int, d: int, positions=None) -> list[np.ndarray]:
    nat = np.arange(n) if positions is None else positions
    return [random_rows(7, t, nat, heads, d, np.float64) for t in ("q", "k", "v")]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("patterns,heads", [([(16, 1), (64, 2), (192, 6)], 6), ([(32, 4), (96, 3)], 5),
                                            ([(192, 8)], 3)])
def test_local_patterns_geometry_equals_the_unfused_computation(patterns, heads, causal):
    n, d = 192, 8
    qs, ks, vs = _inputs(n, heads, d)
    pats = [Pattern(w, r) for w, r in patterns]
    want = local_dilated_attention(qs, ks, vs, pats, causal, 0.3)
    out, lse = KERNELS.accumulators(np, n, heads, d, qs.dtype)
    KERNELS.local_patterns(qs, ks, vs, pats, causal, 0.3, out, lse)
    assert out.dtype == lse.dtype == np.float64
    assert np.abs(out - want).max() <= 1e-12 * np.abs(want).max()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("patterns,every_row", [([(16, 1), (64, 2), (192, 6)], True), ([(64, 2), (48, 1)], True),
                                                ([(64, 2), (192, 6)], False), ([(96, 3)], False),
                                                ([(192, 1), (16, 2)], True)])
def test_an_output_that_patterns_merge_at_every_row_starts_uninitialized(patterns, every_row, causal):
    """``forward_accumulators``: an output starts at zero unless a pattern (dilation 1, segments tiling the rows)
    gives every row a result; then whatever it holds (NaN here) is never read, and the result is the unfused
    computation's."""
    from hilbert_hpc.backends.base import forward_accumulators
    from hilbert_hpc.core.patterns import merges_every_row

    n, heads, d = 192, 5, 8
    qs, ks, vs = _inputs(n, heads, d)
    pats = [Pattern(w, r) for w, r in patterns]
    assert merges_every_row(pats, n) == every_row
    out, lse = forward_accumulators(qs, vs, pats)
    assert out.shape == (n, heads, d) and lse.shape == (n, heads) and np.isneginf(lse).all()
    if every_row:
        out[:] = np.nan                               # what an uninitialized output may hold
    else:
        assert not out.any()                          # rows that no pattern selects keep 0
    KERNELS.local_patterns(qs, ks, vs, pats, causal, 0.3, out, lse)
    want = local_dilated_attention(qs, ks, vs, pats, causal, 0.3)
    assert np.isfinite(out).all() and np.abs(out - want).max() <= 1e-12 * np.abs(want).max()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads,group", [(7, 2), (7, 3), (6, 1), (5, 5), (8, 2)])
def test_head_groups_of_the_float32_running_output_equal_the_unfused_computation(heads, group, causal):
    """tma16's FP32 running output (kernels.sixteen_bit.SixteenBitKernels): every local pattern of a group of heads merged
    into a float32 scratch (n, group, D) through its own output geometry, the group's output widened into it
    first; then either written back after, or (``final``) each row written to the output at its last merge
    (later patterns decide which); groups that do not line up with the dilations, and dilations above H."""
    from hilbert_hpc.kernels import sixteen_bit

    n, d = 192, 8
    qs, ks, vs = _inputs(n, heads, d)
    pats = [Pattern(16, 1), Pattern(48, 3), Pattern(64, 2), Pattern(192, 8)]
    want = local_dilated_attention(qs, ks, vs, pats, causal, 0.3)
    for final in (False, True):
        out, lse = np.full((n, heads, d), np.nan), np.full((n, heads), -np.inf)   # no row holds a result yet
        launches = 0
        for h0 in range(0, heads, group):
            h1 = min(heads, h0 + group)
            scratch = np.full((n, group, d), np.nan)
            scratch[:, :h1 - h0] = out[:, h0:h1]
            for kw in sixteen_bit.group_launches(pats, causal, 0.3, n, heads, d, h0, h1, group, final):
                assert kw.pop("accumulate") and 0 < kw["heads"] <= group and ("final" in kw) == final
                numpy_launch(qs, ks, vs, scratch, lse, final_out=out, **kw)
                launches += 1
            assert np.isnan(scratch[:, h1 - h0:]).all()      # nothing written past the group
            if not final:   # else every row went to the output at its last merge
                out[:, h0:h1] = scratch[:, :h1 - h0]
        assert np.abs(out - want).max() <= 1e-12 * np.abs(want).max(), final
        assert launches == sum(len({h % r for h in range(h0, min(heads, h0 + group))})
                               for h0 in range(0, heads, group) for r in (1, 3, 2, 8))


def test_scratch_heads_keep_the_scratch_small():
    from hilbert_hpc.kernels.selection import choose

    tma16 = choose("bfloat16", 64, cc=90, override="")
    assert tma16.name == "tma16"
    assert [tma16.scratch_heads(h) for h in (1, 3, 4, 8, 12, 16)] == [1, 1, 2, 4, 6, 8]
    assert all(4 * tma16.scratch_heads(h) <= 8 * h / 4 for h in range(2, 64))   # <= 1/4 of 16-bit Q/K/V/O
    assert tma16.scratch_bytes(1000, 12) == 1000 * 6 * 64 * 4
    # the other kernels keep no float32 running output
    assert choose("bfloat16", 96, cc=90, override="wgmma16").scratch_bytes(1000, 12) == 0
    assert choose("float16", 64, cc=80, override="").scratch_heads(12) == 0


def test_sixteen_bit_provider_keeps_a_16bit_output():
    """The 16-bit provider's ring accumulators: the output as 16-bit storage (zero bits = +0.0), LSE float32."""
    from hilbert_hpc.kernels.providers import provider
    from hilbert_hpc.kernels.selection import choose

    for cc in (90, 80):   # tma16 and mma16
        out, lse = provider(choose("bfloat16", 64, cc=cc, override="")).accumulators(np, 4, 3, 8, np.int16)
        assert out.dtype == np.int16 and not out.any() and lse.dtype == np.float32 and np.isneginf(lse).all()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("ordering", ["natural", "hilbert"])
@pytest.mark.parametrize("schedule", ["ring", "gather"])
@pytest.mark.parametrize("global_dilation", [4, 8])
def test_ring_block_geometry_equals_the_unfused_ring(causal, ordering, schedule, global_dilation):
    """Packed blocks around the ring through FusedKernels.ring_block, and gathered patterns through
    FusedKernels.gathered: the same result as the unfused ring (a global dilation of 8 >= 6 heads: one head an
    offset, the offsets coalesced into one launch)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    shard, heads, d = 48, 6, 8
    n = shard * size
    patterns = [Pattern(24, 2), Pattern(2 * shard, 3), Pattern(n, global_dilation)]
    check_distribution(n, size, patterns)
    layout = Layout((n // 16, 16), ordering, size)
    qs, ks, vs = _inputs(n, heads, d, layout.shard_natural(rank))
    want = ring_dilated_attention(qs, ks, vs, patterns=patterns, comm=comm, causal=causal, schedule=schedule)
    got = ring_dilated_attention(qs, ks, vs, patterns=patterns, comm=comm, causal=causal, kernels=KERNELS,
                                 schedule=schedule)
    assert np.abs(got - want).max() <= 1e-12 * np.abs(want).max(), rank


def test_one_head_offsets_of_a_hop_are_one_launch():
    """A global pattern with a dilation of at least the head count has one head an offset: a ring hop's and a
    gathered pattern's offsets are one launch over the heads (steps as head strides), and run through the
    NumPy launcher that launch gives what the launches one by one give; offsets of several heads, or launches
    that write the same rows, stay apart."""
    from hilbert_hpc.distributed.ring import gather_geometry, ring_geometry
    from hilbert_hpc.distributed.sharding import Shards
    from hilbert_hpc.core.launch_geometry import coalesce_heads
    from hilbert_hpc.kernels.launch import ring_launches

    heads, d, shards = 6, 8, Shards(256, 4)
    geom = ring_geometry(Pattern(256, 8), shards, 0, heads, d, d)
    pair = geom.pairs(0, 1, False)[0]
    (hop,) = ring_launches(geom, 0, 1, pair, 0.3, heads, d)
    assert hop["heads"] == heads and hop["kg"][2] == geom.part(1, 1, 0).k0 - geom.part(1, 0, 0).k0
    (gathered,) = gather_geometry(Pattern(256, 8), shards, 0, heads, d, d, True).launches(0.3, heads, d)
    assert gathered["heads"] == heads and gathered["shift"] == 0
    four = ring_launches(ring_geometry(Pattern(256, 4), shards, 0, heads, d, d), 0, 1, pair, 0.3, heads, d)
    assert [kw["heads"] for kw in four] == [2, 2, 2]     # offsets 0, 1 of two heads apart; 2, 3 of one together
    same = dict(hop, heads=1)
    assert coalesce_heads([same, same]) == [same, same]

    n = shards.shard
    qs = random_rows(3, "q", np.arange(n), heads, d, np.float64)
    block = random_rows(3, "k", np.arange(geom.block_size(1)), 1, 1, np.float64).reshape(-1)
    singles = [dict(hop, heads=1, **{g: (hop[g][0] + h * hop[g][2], *hop[g][1:]) for g in ("qg", "kg", "vg", "lg")})
               for h in range(heads)]
    results = []
    for launches in ([hop], singles):
        out, lse = np.zeros((n, heads, d)), np.full((n, heads), -np.inf)
        for kw in launches:
            numpy_launch(qs, block, block, out, lse, **kw)
        results.append((out, lse))
    assert np.isfinite(results[0][1]).sum() == n // 8 * heads      # each head's rows of the hop, once
    assert np.array_equal(results[0][0], results[1][0]) and np.array_equal(results[0][1], results[1][1])


def test_query_chunks_cover_every_row_once():
    """Launches past the grid's y limit are split by query rows, with bases and causal shifts moved along."""
    from hilbert_hpc.kernels.launch import query_chunks

    qg, lg = (100, 7, 3, 40), (5, 2, 1, 8)
    chunks = query_chunks(qg, lg, 1000, 2, block_queries=64, max_blocks=5)
    assert [c[2] for c in chunks] == [320, 320, 320, 40]
    for start, (qc, lc, m, shift) in zip(range(0, 1000, 320), chunks):
        assert qc == (100 + 40 * start, 7, 3, 40) and lc == (5 + 8 * start, 2, 1, 8) and shift == 2 + start
    assert query_chunks(qg, lg, 1000, None, 64)[0] == (qg, lg, 1000, None)


@pytest.mark.parametrize("causal", [False, True])
def test_split_launches_equal_one_launch(causal):
    """The chunks, run through the NumPy launcher, give the result of one launch over all rows."""
    from hilbert_hpc.kernels.launch import query_chunks

    n, heads, d = 96, 2, 8
    qs, ks, vs = _inputs(n, heads, d)
    whole = [np.zeros((n, heads, d)), np.full((n, heads), -np.inf)]
    parts = [np.zeros((n, heads, d)), np.full((n, heads), -np.inf)]
    geo, lgeo = (0, 0, d, heads * d), (0, 0, 1, heads)
    common = dict(kg=geo, vg=geo, segments=1, heads=heads, mk=n, scale=0.4, head_dim=d)
    numpy_launch(qs, ks, vs, *whole, qg=geo, lg=lgeo, mq=n, shift=0 if causal else None, **common)
    for qc, lc, m, shift in query_chunks(geo, lgeo, n, 0 if causal else None, block_queries=8, max_blocks=3):
        numpy_launch(qs, ks, vs, *parts, qg=qc, lg=lc, mq=m, shift=shift, **common)
    assert np.array_equal(parts[0], whole[0]) and np.array_equal(parts[1], whole[1])


def test_sixteen_bit_inputs_are_checked():
    """The 16-bit provider refuses what its kernels would misread (torch CPU tensors stand in for GPU ones)."""
    torch = pytest.importorskip("torch")
    from hilbert_hpc.kernels import sixteen_bit

    q = torch.zeros((64, 2, 32), dtype=torch.bfloat16)
    lse = torch.zeros((64, 2), dtype=torch.float32)
    sixteen_bit.check_arrays(q, q, q, q, lse)
    with pytest.raises(ValueError, match="C-contiguous q"):
        sixteen_bit.check_arrays(q.transpose(0, 1), q, q, q, lse)
    with pytest.raises(ValueError, match="2-byte items"):
        sixteen_bit.check_arrays(q, q.float(), q, q, lse)
    with pytest.raises(ValueError, match="float32 lse"):
        sixteen_bit.check_arrays(q, q, q, q, lse.to(torch.int32))
    with pytest.raises(ValueError, match="aligned to 16 bytes"):
        sixteen_bit.check_arrays(q, q, q, 0x1008, lse)
