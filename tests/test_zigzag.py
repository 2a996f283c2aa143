"""The zigzag placement: chunks p and 2P-1-p on rank p, balanced causal work, exact rings forward and backward."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hilbert_hpc.core.backward import local_dilated_backward
from hilbert_hpc.core.dilated import local_dilated_forward
from hilbert_hpc.core.inputs import random_rows
from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.core.work import imbalance, rank_spans, rank_useful_flops
from hilbert_hpc.distributed.ring import RingPattern, RingStats, ring_dilated_forward
from hilbert_hpc.distributed.ring_backward import ring_dilated_backward
from hilbert_hpc.distributed.sharding import Layout, Shards, check_distribution, zigzag_possible
from hilbert_hpc.errors import ConfigError


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 8])
def test_shards_are_a_bijection(ranks):
    n = 24 * ranks
    shards = Shards(n, ranks, "zigzag")
    held = np.concatenate([shards.serialized(r) for r in range(ranks)])
    assert sorted(held.tolist()) == list(range(n))
    np.testing.assert_array_equal(shards.storage(held), np.arange(n))
    for r in range(ranks):
        s = shards.serialized(r)
        assert (shards.owner(s) == r).all()
        np.testing.assert_array_equal(shards.local_rows(s), np.arange(shards.shard))
        assert [(p.start, p.start + p.rows) for p in shards.pieces(r)] == rank_spans(n, ranks, "zigzag")[r]
    assert [p.start for p in shards.pieces(0)] == [0, (2 * ranks - 1) * 12]


def test_layout_shard_natural_follows_the_placement():
    layout = Layout((8, 8), "hilbert", 4, placement="zigzag")
    whole = Layout((8, 8), "hilbert", 1).shard_natural(0)
    np.testing.assert_array_equal(layout.shard_natural(1), whole[np.r_[8:16, 48:56]])
    np.testing.assert_array_equal(layout.local_rows(np.array([8, 15, 48, 55])), [0, 7, 8, 15])


@pytest.mark.parametrize("placement", ["contiguous", "zigzag"])
def test_placements_split_the_work_exactly(placement):
    pats = [Pattern(64, 1), Pattern(1024, 2), Pattern(4096, 8)]
    per_rank = rank_useful_flops(4096, 8, 8, 64, pats, True, placement=placement)
    whole = rank_useful_flops(4096, 1, 8, 64, pats, True)[0]
    assert sum(per_rank) == whole


@pytest.mark.parametrize("ranks", [2, 4, 8, 64])
@pytest.mark.parametrize("dilation", [1, 4, 16])
def test_zigzag_balances_causal_global_patterns(ranks, dilation):
    n = 256 * ranks
    for pats in ([Pattern(n, dilation)], [Pattern(n // 2, dilation)], [Pattern(64, 1), Pattern(n, dilation)]):
        contiguous = imbalance(rank_useful_flops(n, ranks, 8, 64, pats, True))
        zigzag = imbalance(rank_useful_flops(n, ranks, 8, 64, pats, True, placement="zigzag"))
        assert zigzag <= 1.05, (pats, zigzag)
        if pats == [Pattern(n, dilation)]:
            assert contiguous >= 1.4


def test_check_distribution_zigzag():
    check_distribution(64, 4, [Pattern(8, 1), Pattern(16, 2), Pattern(64, 4)], placement="zigzag")
    with pytest.raises(ConfigError, match="zigzag chunks of 4 ranks do not divide"):
        check_distribution(36, 4, [Pattern(36, 1)], placement="zigzag")
    with pytest.raises(ConfigError, match="segment 6 does not divide the zigzag chunk length 8"):
        check_distribution(64, 4, [Pattern(16, 1), Pattern(6, 1)], placement="zigzag")
    with pytest.raises(ConfigError, match="spans 2 zigzag chunks"):
        check_distribution(48, 3, [Pattern(16, 1)], placement="zigzag")
    with pytest.raises(ConfigError, match="unknown placement"):
        check_distribution(64, 4, [Pattern(64, 1)], placement="striped")
    assert zigzag_possible(64, 4, [Pattern(64, 1)]) and not zigzag_possible(48, 3, [Pattern(16, 1)])
    assert not zigzag_possible(64, 1, [Pattern(64, 1)])


def test_pairs_of_a_zigzag_ring():
    """Rank 1 of 4 holds chunks 1 and 6 of 8: causal, chunk 1 sees chunk 0 of rank 0, chunk 6 sees chunks 0 and 7
    of rank 0 (7 > 6: no) ... every block pair is decided by chunk order inside one segment."""
    shards = Shards(64, 4, "zigzag")
    geom = RingPattern(Pattern(64, 1), shards, 1, 2, 4, 4)
    assert geom.group == 4 and geom.pos == 1
    full = [(p.query, p.key, p.shift) for p in geom.pairs(1, 0, True)]
    assert full == [(0, 0, None), (1, 0, None)]               # chunks 1 and 6 after chunk 0; not after chunk 7
    assert [(p.query, p.key, p.shift) for p in geom.pairs(1, 1, True)] == [(0, 0, 0), (1, 0, None), (1, 1, 0)]
    assert [(p.query, p.key, p.shift) for p in geom.pairs(1, 2, True)] == [(1, 0, None), (1, 1, None)]
    assert len(geom.schedule(True)) == 4
    half = RingPattern(Pattern(32, 1), shards, 1, 2, 4, 4)     # chunks 0-3 and 4-7: two segments, one ring
    assert [(p.query, p.key) for p in half.pairs(1, 2, False)] == [(0, 0), (1, 1)]


# ---- multi-rank exactness (pytest-mpi) ----

def _comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _inputs(positions: np.ndarray, heads: int, d: int) -> list[np.ndarray]:
    return [random_rows(7, t, positions, heads, d, np.float64) for t in ("q", "k", "v", "do")]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("ordering", ["natural", "hilbert"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", ["local", "pair", "half", "global", "all"])
@pytest.mark.parametrize("schedule", ["ring", "gather-kept"])
def test_zigzag_ring_equals_single_rank(schedule, kind, causal, ordering):
    comm = _comm()
    rank, size = comm.Get_rank(), comm.Get_size()
    chunk, heads, d = 16, 3, 8
    n = 2 * size * chunk
    local = [Pattern(8, 2)]
    extra = {"local": [], "pair": [Pattern(2 * chunk, 4)], "half": [Pattern(n // 2, 2)],
             "global": [Pattern(n, 1)], "all": [Pattern(2 * chunk, 2), Pattern(n // 2, 1), Pattern(n, 8)]}[kind]
    if kind in ("pair", "all") and size % 2:
        pytest.skip("a segment of 2 zigzag chunks needs an even rank count")
    patterns = local + extra
    check_distribution(n, size, patterns, placement="zigzag")
    grid = (n // 8, 8) if ordering == "hilbert" else (n,)
    layout = Layout(grid, ordering, size, placement="zigzag")
    q, k, v, do = _inputs(layout.shard_natural(rank), heads, d)
    scale = 1.0 / math.sqrt(d)
    stats = RingStats()
    name, kept = schedule.removesuffix("-kept"), {}
    out, lse = ring_dilated_forward(q, k, v, patterns=patterns, comm=comm, causal=causal, scale=scale, stats=stats,
                                    placement="zigzag", schedule=name, gathered=kept)
    grads = ring_dilated_backward(q, k, v, out, lse, do, patterns=patterns, comm=comm, causal=causal, scale=scale,
                                  stats=stats, placement="zigzag", schedule=name, gathered=kept)
    whole = _inputs(Layout(grid, ordering, 1).shard_natural(0), heads, d)
    w_out, w_lse = local_dilated_forward(*whole[:3], patterns, causal, scale)
    want = local_dilated_backward(*whole[:3], w_out, w_lse, whole[3], patterns, causal, scale)
    mine = layout.shards.serialized(rank)
    for name, got, ref in (("out", out, w_out), ("lse", lse, w_lse), *zip(("dq", "dk", "dv"), grads, want)):
        finite = np.isfinite(ref[mine])
        assert (np.isfinite(got) == finite).all(), name
        err = np.abs(np.where(finite, got, 0) - np.where(finite, ref[mine], 0)).max() / \
            np.abs(np.where(np.isfinite(ref), ref, 0)).max()
        assert err <= 1e-12, f"rank {rank}: {name} relative error {err:.2e} ({kind}, causal={causal}, {schedule})"
    assert (stats.ring_steps > 0) == (kind != "local" and schedule == "ring")


def test_auto_placement_takes_zigzag_only_where_contiguous_shards_are_unbalanced():
    """placement = "auto": a causal global pattern on 4 ranks (contiguous: 1.75x the mean) goes zigzag; LongNet's
    causal patterns (contiguous: balanced per segment) and every non-causal case stay contiguous."""
    import dataclasses

    from hilbert_hpc.core.patterns import parse_patterns
    from hilbert_hpc.study.jobfile import Case
    from hilbert_hpc.study.setup import BALANCED, case_placement

    longnet = parse_patterns([[2048, 1], [8192, 4], [32768, 16], [1 << 22, 2048]])
    case = Case(case_id="c", name="c", grid=(1 << 22,), patterns=longnet, heads=8, head_dim=64, causal=True)
    assert BALANCED == 1.05
    assert case_placement(case, 2) == case_placement(case, 8) == "contiguous"
    assert case_placement(dataclasses.replace(case, placement="zigzag"), 2) == "zigzag"      # asked for: kept
    glob = dataclasses.replace(case, grid=(4096,), patterns=parse_patterns([[4096, 1]]))
    assert case_placement(glob, 4) == "zigzag" and case_placement(glob, 1) == "contiguous"
    assert case_placement(dataclasses.replace(glob, causal=False), 4) == "contiguous"
