"""Distributed dilated attention (pytest-mpi): every rank count gives the single-rank result."""

from __future__ import annotations

import numpy as np
import pytest

from hilbert_hpc import dilated_attention
from hilbert_hpc.core.inputs import random_rows
from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.distributed.ring import RingStats, ring_dilated_attention, ring_schedule
from hilbert_hpc.distributed.sharding import Layout, check_distribution

pytestmark = pytest.mark.mpi(min_size=2)

GRIDS = {1: lambda n: (n,), 2: lambda n: (n // 16, 16), 3: lambda n: (n // 64, 8, 8)}


def _comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _random_case(rng: np.random.Generator, ranks: int) -> dict:
    """Shard of 32..64 tokens; patterns local, spanning 2 ranks and spanning all ranks, dilations 1..8."""
    shard = int(rng.choice([32, 48, 64]))
    n = shard * ranks
    candidates = [Pattern(shard // 2, int(rng.choice([1, 2]))), Pattern(shard, int(rng.choice([1, 4])))]
    if ranks >= 2:
        candidates.append(Pattern(2 * shard, int(rng.choice([2, 3, 8])) if (2 * shard) % 3 == 0
                                  else int(rng.choice([2, 8]))))
    candidates.append(Pattern(n, int(rng.choice([r for r in (1, 2, 3, 4, 6, 8, 16) if n % r == 0]))))
    picked = [candidates[i] for i in sorted(rng.choice(len(candidates), size=int(rng.integers(1, 4)), replace=False))]
    if not any(p.segment > shard for p in picked):
        picked.append(candidates[-1])
    dims = int(rng.integers(1, 4))
    grid = GRIDS[dims](n) if n % (16 if dims == 2 else 64 if dims == 3 else 1) == 0 else (n,)
    return {"n": n, "shard": shard, "patterns": picked, "heads": int(rng.integers(1, 7)),
            "head_dim": int(rng.choice([8, 16, 24])), "causal": bool(rng.integers(0, 2)),
            "ordering": str(rng.choice(["natural", "hilbert"])), "grid": grid}


def _shard_inputs(case: dict, layout: Layout, rank: int, dtype) -> list[np.ndarray]:
    nat = layout.shard_natural(rank)
    return [random_rows(11, t, nat, case["heads"], case["head_dim"], dtype) for t in ("q", "k", "v")]


@pytest.mark.parametrize("schedule", ["ring", "gather"])
@pytest.mark.parametrize("seed", range(12))
def test_ring_equals_single_rank_float64(seed, schedule):
    comm = _comm()
    rank, size = comm.Get_rank(), comm.Get_size()
    case = _random_case(np.random.default_rng(seed + 1000 * size), size)
    check_distribution(case["n"], size, case["patterns"])
    layout = Layout(case["grid"], case["ordering"], size)
    qs, ks, vs = _shard_inputs(case, layout, rank, np.float64)
    stats = RingStats()
    got = ring_dilated_attention(qs, ks, vs, patterns=case["patterns"], comm=comm, causal=case["causal"],
                                 stats=stats, schedule=schedule)
    assert got.shape == qs.shape
    # the single-rank result of the same global problem, built on every rank from natural order
    nat = np.arange(case["n"])
    full = [random_rows(11, t, nat, case["heads"], case["head_dim"], np.float64) for t in ("q", "k", "v")]
    single = dilated_attention(*full, patterns=[(p.segment, p.dilation) for p in case["patterns"]],
                               causal=case["causal"], grid=case["grid"], ordering=case["ordering"])
    want = single[layout.shard_natural(rank)]
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 1e-12, f"rank {rank}: relative error {err:.2e} for {case} ({schedule})"
    assert (stats.ring_steps > 0) == (schedule == "ring")


@pytest.mark.parametrize("schedule", ["ring", "gather"])
@pytest.mark.parametrize("causal", [False, True])
def test_ring_float32_and_bytes(causal, schedule):
    comm = _comm()
    rank, size = comm.Get_rank(), comm.Get_size()
    shard, heads, d = 64, 4, 16
    n = shard * size
    patterns = [Pattern(shard, 2), Pattern(n, 4)]
    layout = Layout((n,), "natural", size)
    case = {"heads": heads, "head_dim": d}
    q32, k32, v32 = _shard_inputs(case, layout, rank, np.float32)
    stats = RingStats()
    got = ring_dilated_attention(q32, k32, v32, patterns=patterns, comm=comm, causal=causal, stats=stats,
                                 schedule=schedule)
    assert got.dtype == np.float32
    q64, k64, v64 = (x.astype(np.float64) for x in (q32, k32, v32))
    want = ring_dilated_attention(q64, k64, v64, patterns=patterns, comm=comm, causal=causal, schedule="ring")
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5
    # the long pattern sends L/r rows of K and V per head-offset group: traffic / dilation; the ring forwards
    # blocks hop by hop, the gather sends this rank's block to each rank that needs it (causal: the later ones)
    per_block = (shard // 4) * heads * 2 * d * 4
    if schedule == "ring":
        sends = sum(send for _, send, _ in ring_schedule(rank, size, causal))
    else:
        sends = size - 1 - rank if causal else size - 1
    assert stats.bytes_sent == sends * per_block and stats.messages == sends


def _peak_bytes(comm, shard: int, heads: int, d: int) -> int:
    """Peak traced allocation of this rank making its inputs and running the ring on ``comm``."""
    import tracemalloc

    n = shard * comm.Get_size()
    side = int(round(n ** 0.5))
    layout = Layout((side, side), "hilbert", comm.Get_size()) if side * side == n else Layout((n,), "hilbert",
                                                                                               comm.Get_size())
    tracemalloc.start()
    qs, ks, vs = _shard_inputs({"heads": heads, "head_dim": d}, layout, comm.Get_rank(), np.float32)
    ring_dilated_attention(qs, ks, vs, patterns=[Pattern(1024, 1), Pattern(n, 8)], comm=comm, schedule="ring")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def test_memory_per_rank_does_not_grow_with_the_sequence():
    """Same shard length on 1 rank and on all ranks: the ring's peak stays O(L), it does not follow N = P*L (the
    gather schedule holds the group's selected rows, within its budget: tests/test_schedule.py)."""
    from mpi4py import MPI

    comm = _comm()
    shard, heads, d = 8192, 4, 64
    alone = _peak_bytes(MPI.COMM_SELF, shard, heads, d)
    together = _peak_bytes(comm, shard, heads, d)
    shard_qkv = 3 * shard * heads * d * 4
    assert together < alone + shard_qkv // 2, f"peak {together} B on {comm.Get_size()} ranks vs {alone} B alone"
