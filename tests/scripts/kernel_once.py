"""One forward call of a forced FP32 kernel variant on the DESIGN anchor, for Nsight Compute.

    ncu --clock-control none --kernel-name regex:dilated_fwd --launch-skip 7 --launch-count 1 \\
        --section SpeedOfLight --section WarpStateStats python3 tests/scripts/kernel_once.py wgmma 64

Arguments: variant (wgmma, tf32x3, tiled128, ...), head dim (default 64), tokens (default 262144),
heads (default 768 / head dim), and for wgmma a block configuration "keys,warpgroups,parts"
(kernels.WGMMA_CONFIG). A warm-up call (7 launches for the anchor's patterns, compiles the
kernel) comes first, so ``--launch-skip 7`` profiles the first launch of the measured call: pattern
(2048, 1), all heads.
"""

from __future__ import annotations

import math
import os
import sys

import cupy
import numpy as np

from hilbert_hpc import fused, kernels
from hilbert_hpc.patterns import Pattern


def main() -> int:
    variant = sys.argv[1] if len(sys.argv) > 1 else "wgmma"
    d = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 262144
    h = int(sys.argv[4]) if len(sys.argv) > 4 else 768 // d
    if len(sys.argv) > 5:
        kernels.WGMMA_CONFIG[d] = tuple(int(x) for x in sys.argv[5].split(","))
    os.environ[kernels.VARIANT_ENV] = variant
    rng = cupy.random.default_rng(3)
    q, k, v = (rng.standard_normal((n, h, d), dtype=cupy.float32) for _ in range(3))
    patterns = [Pattern(2048, 1), Pattern(4096, 2), Pattern(8192, 4)]
    for _ in range(2):
        out = cupy.zeros((n, h, d), dtype=cupy.float32)
        lse = cupy.full((n, h), -np.inf, dtype=cupy.float32)
        fused.local_patterns(q, k, v, patterns, False, 1.0 / math.sqrt(d), out, lse)
    cupy.cuda.get_current_stream().synchronize()
    print(f"{variant} D={d} N={n} H={h}: {kernels.select_fp32(d).name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
