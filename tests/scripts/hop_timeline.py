"""Where a long pattern's time goes: a timeline of one forward call, the ring's hops or the gathered pattern.

Run under MPI, one rank a GPU (or several a GPU, or on CPUs with ``--backend numpy``): each rank makes its
shard of random inputs, runs the distributed forward ``--warmup`` times, then once more with a
:class:`hilbert_hpc.distributed.timeline.Timeline`, and rank 0 prints its marks: host time, GPU time (stream
events) and the step since the previous mark of each, for the local patterns, the gather's packing, exchange,
sequence-order copy and launch, and each ring hop's posting, launches, compute and wait. Patterns: one local
``(--local, 1)`` and one global ``(N, N / --rows)`` selecting ``--rows`` rows a segment and head.

    mpirun -n 2 python tests/scripts/hop_timeline.py --schedule ring --transport cuda-aware
    mpirun -n 4 python tests/scripts/hop_timeline.py --schedule gather --dtype float32 --backend cuda
    mpiexec -n 2 python tests/scripts/hop_timeline.py --backend numpy --dtype float64 --tokens 4096 --heads 2
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hilbert_hpc.backends import find_backend  # noqa: E402
from hilbert_hpc.core.inputs import random_rows  # noqa: E402
from hilbert_hpc.core.patterns import Pattern  # noqa: E402
from hilbert_hpc.distributed.ring import RingStats, ring_dilated_forward  # noqa: E402
from hilbert_hpc.distributed.sharding import Layout  # noqa: E402
from hilbert_hpc.distributed.timeline import Timeline  # noqa: E402
from hilbert_hpc.distributed.transports import resolve_transport  # noqa: E402
from hilbert_hpc.study.measure import generation_module  # noqa: E402
from problem_args import add_problem_arguments  # noqa: E402


def median_ms(call: Callable[[], object], be: Any, comm: Any, repeats: int) -> float:
    """The median over ``repeats`` of the slowest rank's time of ``call`` (ms), each started at a barrier."""
    times = []
    for _ in range(repeats):
        comm.Barrier()
        t0 = time.perf_counter()
        call()
        be.synchronize()
        times.append(comm.allreduce(time.perf_counter() - t0, op=max_op()))
    return float(np.median(times)) * 1e3


def max_op() -> Any:
    """MPI's MAX."""
    from mpi4py import MPI

    return MPI.MAX


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_problem_arguments(ap)
    ap.add_argument("--local", type=int, default=2048, help="segment of the local pattern (dilation 1)")
    ap.add_argument("--rows", type=int, default=1024, help="rows the global pattern selects a segment and head")
    ap.add_argument("--schedule", choices=("gather", "ring"), default="gather")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--transport", default="auto")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5, help="timed calls with and without the global pattern")
    ap.add_argument("--show", default="first,last", help="ranks whose timelines to print: first, last, all")
    args = ap.parse_args()

    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    be = find_backend(args.backend).require()
    if be.on_gpu:
        from hilbert_hpc.distributed.mpi import bind_gpu

        bind_gpu(comm)
    patterns = [Pattern(args.local, 1), Pattern(args.tokens, args.tokens // args.rows)]
    layout = Layout((args.tokens,), "natural", size)
    d = args.head_dim
    xp = generation_module(be.on_gpu)             # rows made where they are used (host generation takes minutes)
    made = [random_rows(37, t, layout.shard_natural(rank), args.heads, d, np.float32, xp) for t in ("q", "k", "v")]
    kernel = be.kernel_choice(d, args.dtype)
    side = be.ring_side(args.dtype, kernel)
    qs, ks, vs = (side.view(be.to_device(x, args.dtype)) for x in made)
    del made
    transport, why = resolve_transport(args.transport, be.on_gpu, comm)
    call = dict(patterns=patterns, comm=comm, causal=args.causal, transport=transport, kernels=side.forward,
                schedule=args.schedule, sync_rings=True)
    for _ in range(args.warmup):
        ring_dilated_forward(qs, ks, vs, **call)
    be.synchronize()
    comm.Barrier()
    full = median_ms(lambda: ring_dilated_forward(qs, ks, vs, **call), be, comm, args.repeats)
    local = median_ms(lambda: ring_dilated_forward(qs, ks, vs, **{**call, "patterns": patterns[:1]}), be, comm,
                      args.repeats)
    timeline, stats = Timeline(), RingStats()
    ring_dilated_forward(qs, ks, vs, stats=stats, timeline=timeline, **call)
    be.synchronize()
    tables = comm.gather((timeline.table(), stats), root=0)
    if rank == 0:
        shown = range(size) if args.show == "all" else sorted({0 if w == "first" else size - 1
                                                              for w in args.show.split(",")})
        print(f"# {size} ranks, backend {be.name} {args.dtype}, N = {args.tokens:,}, H = {args.heads}, D = {d}, "
              f"patterns {[(p.segment, p.dilation) for p in patterns]}, schedule {args.schedule}, "
              f"causal {args.causal}, transport {transport.name} ({why})")
        for r in shown:
            table, stats = tables[r]
            print(f"## rank {r}")
            print(table)
            print(f"# counters: local {stats.local_s * 1e3:.3f} ms, compute {stats.compute_s * 1e3:.3f}, wait "
                  f"{stats.wait_s * 1e3:.3f}, pack {stats.pack_s * 1e3:.3f}, imbalance {stats.imbalance_s * 1e3:.3f}, "
                  f"{stats.ring_steps} hops, {stats.messages} messages, {stats.bytes_sent:,} bytes sent")
        print(f"# forward, slowest rank, median of {args.repeats}: {full:.3f} ms with the global pattern, "
              f"{local:.3f} ms without: the global pattern adds {full - local:.3f} ms")


if __name__ == "__main__":
    main()
