"""The forward's timeline (``distributed.timeline``): a mark at each phase of the local patterns, the gathered
patterns and every ring hop, in order, on every schedule."""

from __future__ import annotations

import numpy as np
import pytest

from hilbert_hpc.core.inputs import random_rows
from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.distributed.ring import RingStats, ring_dilated_forward
from hilbert_hpc.distributed.sharding import Layout
from hilbert_hpc.distributed.timeline import Timeline

GATHER = ["start", "accumulators", "gathers packed and posted", "local patterns launched", "local patterns done",
          "gathers received, in order", "gathered patterns launched", "gathered patterns done"]
HOP = ["posted", "launched", "computed", "received"]


def test_a_timeline_without_a_gpu_has_host_times_only():
    t = Timeline()
    t.mark("a")
    t.mark("b")
    rows = t.rows()
    assert [r[0] for r in rows] == ["a", "b"] and rows[0][1] == 0.0 <= rows[1][1] and rows[1][2] is None
    assert t.table().splitlines()[2].split()[:3] == ["b", f"{rows[1][1]:.3f}", "-"]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("schedule", ["gather", "ring"])
def test_the_forward_marks_every_phase_in_order(schedule):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    n, heads, d = 64 * size, 2, 8
    layout = Layout((n,), "natural", size)
    qs, ks, vs = (random_rows(3, t, layout.shard_natural(comm.Get_rank()), heads, d, np.float64) for t in "qkv")
    timeline, stats = Timeline(), RingStats()
    ring_dilated_forward(qs, ks, vs, patterns=[Pattern(32, 1), Pattern(n, 4)], comm=comm, schedule=schedule,
                         stats=stats, timeline=timeline)
    names = [name for name, _, _ in timeline.rows()]
    hops = [f"hop {t}: {phase}" for t in range(stats.ring_steps) for phase in HOP]
    assert names == GATHER + (["ring: packed"] + hops if schedule == "ring" else [])
    assert (stats.ring_steps > 0) == (schedule == "ring")
    host = [h for _, h, _ in timeline.rows()]
    assert host == sorted(host)
