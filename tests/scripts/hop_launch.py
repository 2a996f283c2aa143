"""What one ring hop's compute costs without the transport: the launch of a packed block, on one GPU, one process.

A ring hop is its exchange (the transport's latency plus bytes over bandwidth: ``hilbert-hpc bandwidth``) and
its compute: the launches of the block's piece pairs and their kernels. This script measures the compute alone
on an unshared GPU (several ranks on one GPU time-slice it, which hides a hop's own time): ring position 0 of a
``--ranks``-rank ring of one global pattern ``(N, N / --rows)`` attends to the packed block of position 1, the
same calls the ring makes (``ring_block`` of the case's forward provider; ``--backward``: of the backward
provider), and the gathered pattern's one launch likewise (``gathered``). For each it prints the host time of a
call (the launch path), the GPU time of a call when calls run back to back, and the latency of a call that is
waited for (host and GPU in series: what a hop adds to the critical path), medians over ``--calls``; then the
host path's profile (``--profile``).

    python tests/scripts/hop_launch.py --rows 1024 4096 16384 --ranks 2 4 16
    python tests/scripts/hop_launch.py --dtype float32 --profile
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hilbert_hpc.backends import find_backend  # noqa: E402
from hilbert_hpc.core.patterns import Pattern  # noqa: E402
from hilbert_hpc.distributed.ring import gather_geometry, ring_geometry  # noqa: E402
from hilbert_hpc.distributed.sharding import Shards, count  # noqa: E402
from problem_args import add_problem_arguments  # noqa: E402


def timings(call: Callable[[], None], calls: int) -> tuple[float, float, float]:
    """(host us of a call, GPU us of a call back to back, us of a call waited for), medians over ``calls``."""
    import cupy

    stream = cupy.cuda.get_current_stream()
    for _ in range(3):
        call()
    stream.synchronize()
    host, waited = [], []
    start = stream.record()
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        host.append(time.perf_counter() - t0)
    end = stream.record()
    end.synchronize()
    gpu = cupy.cuda.get_elapsed_time(start, end) * 1e3 / calls
    for _ in range(calls):
        stream.synchronize()
        t0 = time.perf_counter()
        call()
        stream.synchronize()
        waited.append(time.perf_counter() - t0)
    return float(np.median(host)) * 1e6, gpu, float(np.median(waited)) * 1e6


def profile(call: Callable[[], None], calls: int) -> str:
    """The host path of ``calls`` calls, top functions by own time."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        call()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(14)
    return text.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_problem_arguments(ap)
    ap.add_argument("--rows", type=int, nargs="+", default=[1024], help="rows the global pattern selects a segment")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2], help="ring sizes (the block of position 1)")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--profile", action="store_true", help="print the host path's profile of the first case")
    args = ap.parse_args()

    import cupy

    be = find_backend(args.backend).require()
    kernel = be.kernel_choice(args.head_dim, args.dtype)
    side = be.ring_side(args.dtype, kernel)
    kernels = side.forward
    d, h = args.head_dim, args.heads
    scale = 1.0 / np.sqrt(d)
    print(f"# hop compute on one GPU ({cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}), backend "
          f"{be.name} {args.dtype}, N = {args.tokens:,}, H = {h}, D = {d}, causal {args.causal}; us, medians of "
          f"{args.calls} calls")
    print(f"{'ranks':>5} {'rows':>6} {'what':<9} {'M q x k':>9} {'host us':>8} {'gpu us':>8} {'waited us':>9}")
    profiled = False
    for ranks in args.ranks:
        shards = Shards(args.tokens, ranks)
        n = shards.shard
        made = cupy.random.standard_normal((n, h, d), dtype=np.float32)
        qs = side.view(be.to_device(made, args.dtype))
        del made
        out, lse = kernels.accumulators(cupy, n, h, d, qs.dtype)
        for rows in args.rows:
            pattern = Pattern(args.tokens, args.tokens // rows)
            pos, src = (1, 0) if args.causal else (0, 1)    # causal: a later position sees an earlier block
            geom = ring_geometry(pattern, shards, pos, h, d, d)
            pairs = geom.pairs(pos, src, args.causal)
            block = side.view(be.to_device(cupy.random.standard_normal(geom.block_size(src), dtype=np.float32),
                                           args.dtype))
            hop_rows = sum(count(geom.rows(pos, p.query, o)) * geom.part(src, i, p.key).rows * geom.nheads(o)
                           for p in pairs for i, o in enumerate(geom.offsets))

            def hop() -> None:
                for pair in pairs:
                    kernels.ring_block(qs, block, geom, pos, src, pair, scale, out, lse)

            gather = gather_geometry(pattern, shards, pos, h, d, d, args.causal)
            sequence = cupy.zeros(gather.sequence_elements, dtype=block.dtype)
            gather_rows = sum(mq * mk * region.nheads for _, region, _, mq, mk, _ in gather.problems())

            def gathered() -> None:
                kernels.gathered(qs, sequence, gather, scale, out, lse)

            for what, call, products in (("ring hop", hop, hop_rows), ("gathered", gathered, gather_rows)):
                host, gpu, waited = timings(call, args.calls)
                print(f"{ranks:>5} {rows:>6} {what:<9} {products / 1e6:>9.2f} {host:8.1f} {gpu:8.1f} {waited:9.1f}")
                if args.profile and not profiled:
                    print(profile(call, args.calls))
                    profiled = True


if __name__ == "__main__":
    main()
