"""Distributed backward (pytest-mpi): every rank's shard gradients equal the single-rank gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hilbert_hpc.core.backward import local_dilated_backward
from hilbert_hpc.core.dilated import local_dilated_forward
from hilbert_hpc.core.inputs import random_rows
from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.distributed.ring import RingStats, ring_dilated_attention, ring_dilated_forward
from hilbert_hpc.distributed.ring_backward import ring_dilated_backward
from hilbert_hpc.distributed.sharding import Layout, check_distribution

pytestmark = pytest.mark.mpi(min_size=2)


def _comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _case(rng: np.random.Generator, ranks: int, kind: str, causal: bool, ordering: str) -> dict:
    """A local pattern plus, by ``kind``: one spanning 2 ranks ("long"), all ranks ("global"), or none."""
    shard = int(rng.choice([32, 48, 64]))
    n = shard * ranks
    patterns = [Pattern(shard // 2, int(rng.choice([1, 2])))]
    if kind in ("long", "both"):
        patterns.append(Pattern(2 * shard, int(rng.choice([2, 8]))))
    if kind in ("global", "both"):
        patterns.append(Pattern(n, int(rng.choice([r for r in (1, 2, 4, 8) if n % r == 0]))))
    grid = (n // 16, 16) if ordering == "hilbert" and n % 16 == 0 else (n,)
    return {"n": n, "shard": shard, "patterns": patterns, "heads": int(rng.integers(1, 6)),
            "head_dim": int(rng.choice([8, 16])), "causal": causal, "ordering": ordering, "grid": grid}


def _inputs(positions: np.ndarray, case: dict) -> list[np.ndarray]:
    return [random_rows(11, t, positions, case["heads"], case["head_dim"], np.float64) for t in ("q", "k", "v", "do")]


@pytest.mark.parametrize("schedule", ["ring", "gather", "gather-kept"])
@pytest.mark.parametrize("ordering", ["natural", "hilbert"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", ["local", "long", "global", "both"])
def test_ring_backward_equals_single_rank_float64(kind, causal, ordering, schedule):
    """Both schedules; ``gather-kept``: the backward reuses the forward's gathered rows instead of gathering."""
    comm = _comm()
    rank, size = comm.Get_rank(), comm.Get_size()
    if kind == "long" and size < 2:
        pytest.skip("a pattern spanning 2 ranks needs 2 ranks")
    seed = ["local", "long", "global", "both"].index(kind) * 4 + 2 * causal + (ordering == "hilbert")
    case = _case(np.random.default_rng(seed + 100 * size), size, kind, causal, ordering)
    check_distribution(case["n"], size, case["patterns"])
    scale = 1.0 / math.sqrt(case["head_dim"])
    layout = Layout(case["grid"], case["ordering"], size)
    qs, ks, vs, dos = _inputs(layout.shard_natural(rank), case)
    kept = {} if schedule == "gather-kept" else None
    name = schedule.removesuffix("-kept")
    out, lse = ring_dilated_forward(qs, ks, vs, patterns=case["patterns"], comm=comm, causal=causal, scale=scale,
                                    schedule=name, gathered=kept)
    np.testing.assert_array_equal(out, ring_dilated_attention(qs, ks, vs, patterns=case["patterns"], comm=comm,
                                                              causal=causal, scale=scale, schedule=name))
    stats = RingStats()
    got = ring_dilated_backward(qs, ks, vs, out, lse, dos, patterns=case["patterns"], comm=comm, causal=causal,
                                scale=scale, stats=stats, schedule=name, gathered=kept)
    # the single-rank gradients of the whole serialized sequence, on every rank
    whole = _inputs(Layout(case["grid"], case["ordering"], 1).shard_natural(0), case)
    w_out, w_lse = local_dilated_forward(*whole[:3], case["patterns"], causal, scale)
    want = local_dilated_backward(*whole[:3], w_out, w_lse, whole[3], case["patterns"], causal, scale)
    rows = slice(rank * case["shard"], (rank + 1) * case["shard"])
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert g.shape == qs.shape
        scale_w = np.abs(w).max()
        err = np.abs(g - w[rows]).max() / scale_w
        assert err <= 1e-12, f"rank {rank}: {name} relative error {err:.2e} for {case} ({schedule})"
    assert (stats.ring_steps > 0) == (kind != "local" and schedule == "ring")
    if kept is not None:                  # the forward kept its gathered rows for the backward
        assert bool(kept) == (kind != "local")


@pytest.mark.parametrize("schedule", ["ring", "gather"])
@pytest.mark.parametrize("causal", [False, True])
def test_ring_backward_float32_and_traffic(causal, schedule):
    """float32 inputs give float32 gradients near float64; ring: each accumulator makes the full ring plus home;
    gather: K/V to the ranks that need them, terms home to their owners, one message each."""
    comm = _comm()
    rank, size = comm.Get_rank(), comm.Get_size()
    shard, heads, d = 64, 4, 16
    n = shard * size
    patterns = [Pattern(shard, 2), Pattern(n, 4)]
    case = {"heads": heads, "head_dim": d}
    q, k, v, do = _inputs(Layout((n,), "natural", size).shard_natural(rank), case)
    grads64 = ring_dilated_backward(q, k, v, *ring_dilated_forward(q, k, v, patterns=patterns, comm=comm,
                                                                     causal=causal, schedule="ring"), do,
                                    patterns=patterns, comm=comm, causal=causal, schedule="ring")
    q32, k32, v32, do32 = (x.astype(np.float32) for x in (q, k, v, do))
    out32, lse32 = ring_dilated_forward(q32, k32, v32, patterns=patterns, comm=comm, causal=causal, schedule=schedule)
    stats = RingStats()
    grads32 = ring_dilated_backward(q32, k32, v32, out32, lse32, do32, patterns=patterns, comm=comm, causal=causal,
                                    stats=stats, schedule=schedule)
    for g32, g64 in zip(grads32, grads64):
        assert g32.dtype == np.float32
        assert np.abs(g32 - g64).max() / np.abs(g64).max() < 1e-4
    block = (shard // 4) * heads * 2 * d
    if schedule == "ring":
        kv_sends = rank + 1 if causal and rank + 1 < size else (0 if causal else size - 1)
        assert stats.bytes_sent == kv_sends * block * 4 + size * block * 4
        assert stats.messages == kv_sends + size
    else:
        kv_sends, home_sends = (size - 1 - rank, rank) if causal else (size - 1, size - 1)
        assert stats.bytes_sent == (kv_sends + home_sends) * block * 4
        assert stats.messages == kv_sends + home_sends
