"""The fixed cost of a block of the Hopper 16-bit backward kernel (``wgmma16_bwd``): what a block spends beside its
query tiles (staging K and V, filling the pipeline, the last tile's dQ, writing dK and dV).

One pattern (w, 1) over the whole sequence at a time, w = 512 ... 8192: the launch has N H / BK blocks whatever w
(BK = 128 keys a block), each walking w / 64 query tiles, so its time is T(w) = N H / (BK SMs) (c + (w / 64) t)
with c the fixed cost of a block and t the time of one query tile on one SM. A least-squares line through the
measured T(w) gives c and t; the share of c in a block of the anchor's 2048-row problems is c / (c + 32 t). Times
are CUDA-event medians of 5 after 2 warm-ups of ``bwd_wgmma16_check.time_case`` (the default configuration,
bfloat16, non-causal).

    python3 tests/scripts/bwd_block_cost.py --head-dim 64 --head-dim 32 --head-dim 128
"""

from __future__ import annotations

import argparse
import contextlib
import io

import cupy
import numpy as np

from bwd_wgmma16_check import time_case
from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.kernels.registry import WGMMA16_BWD

N = 262144
HEADS = {32: 16, 64: 12, 96: 8, 128: 8}
SEGMENTS = (512, 1024, 2048, 4096, 8192)


def block_cost(d: int) -> None:
    """Print T(w) for each segment and the fitted fixed cost of a block and time of a tile (microseconds)."""
    cfg = WGMMA16_BWD.defaults[d]
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    heads, bk = HEADS[d], 64 * cfg[0]
    times = []
    for w in SEGMENTS:
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            time_case("bfloat16", d, cfg, (N, heads, [Pattern(w, 1)]), False)
        ms = float(text.getvalue().split(": ")[1].split(" ms")[0])
        times.append(ms)
        print(f"D={d} w={w}: {ms:.3f} ms", flush=True)
    slope, intercept = np.polyfit(np.array(SEGMENTS, dtype=float), np.array(times), 1)
    per_sm = N * heads / bk / sms                     # blocks an SM runs
    fixed = intercept * 1e3 / per_sm                  # us
    tile = slope * 64 * 1e3 / per_sm                  # us
    print(f"D={d} {cfg}: fixed cost of a block {fixed:.2f} us, a query tile "
          f"{tile:.3f} us; in a 2048-row problem's block ({2048 // 64} tiles) the fixed cost is "
          f"{100 * fixed / (fixed + 32 * tile):.1f} %", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dim", type=int, action="append", choices=sorted(HEADS))
    args = parser.parse_args()
    for d in args.head_dim or [64]:
        block_cost(d)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
