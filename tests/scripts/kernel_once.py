"""One forward call of a forced kernel variant on the anchor (docs/performance.md), for Nsight Compute.

    ncu --clock-control none --kernel-name regex:dilated_fwd --launch-skip 7 --launch-count 1 \\
        --section SpeedOfLight --section WarpStateStats python3 tests/scripts/kernel_once.py wgmma 64

Arguments: variant (FP32: wgmma, tf32x3, tiled128, ...; bfloat16: wgmma16, tma16, mma16), head dim (default 64),
tokens (default 262144), heads (default 768 / head dim), and a configuration of the variant's family (its
``config_fields`` in kernels/registry.py: for wgmma "keys,warpgroups,parts", for wgmma16 "keys,warpgroups,vmode",
for tma16 "keys,consumers,stages,pipe", for mma16 "keys"), forced as "variant:configuration". A warm-up call (compiles the kernel) comes first. FP32,
wgmma16 and mma16 make 7 launches a call for the anchor's patterns, so ``--launch-skip 7`` profiles the first
launch of the measured call: pattern (2048, 1), all heads. tma16 merges into a float32 running output for half
the heads at a time: 7 launches a group, 14 a call, so ``--launch-skip 14`` profiles pattern (2048, 1) of the
first half of the heads (its conversion kernels, widen_16 / narrow_16, do not match ``dilated_fwd``).
"""

from __future__ import annotations

import math
import os
import sys

import cupy
import numpy as np

from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.kernels.providers import provider
from hilbert_hpc.kernels.selection import FP32_ENV, SIXTEEN_BIT_ENV, choose


def main() -> int:
    variant = sys.argv[1] if len(sys.argv) > 1 else "wgmma"
    d = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 262144
    h = int(sys.argv[4]) if len(sys.argv) > 4 else 768 // d
    forced = f"{variant}:{sys.argv[5]}" if len(sys.argv) > 5 else variant
    patterns = [Pattern(2048, 1), Pattern(4096, 2), Pattern(8192, 4)]
    if variant in ("wgmma16", "tma16", "mma16"):
        return sixteen_bit(forced, d, n, h, patterns)
    os.environ[FP32_ENV] = forced
    choice = choose("float32", d)
    rng = cupy.random.default_rng(3)
    q, k, v = (rng.standard_normal((n, h, d), dtype=cupy.float32) for _ in range(3))
    for _ in range(2):
        out = cupy.zeros((n, h, d), dtype=cupy.float32)
        lse = cupy.full((n, h), -np.inf, dtype=cupy.float32)
        provider(choice).local_patterns(q, k, v, patterns, False, 1.0 / math.sqrt(d), out, lse)
    cupy.cuda.get_current_stream().synchronize()
    print(f"{forced} D={d} N={n} H={h}: {choice.variant.name}")
    return 0


def sixteen_bit(forced: str, d: int, n: int, h: int, patterns: list) -> int:
    """The same two calls with a 16-bit kernel on bfloat16 inputs."""
    import torch

    os.environ[SIXTEEN_BIT_ENV] = forced
    choice = choose("bfloat16", d)
    gen = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn((n, h, d), generator=gen, device="cuda").to(torch.bfloat16) for _ in range(3))
    for _ in range(2):
        out = torch.zeros_like(q)
        lse = torch.full((n, h), float("-inf"), device="cuda")
        provider(choice).local_patterns(q, k, v, patterns, False, 1.0 / math.sqrt(d), out, lse)
    torch.cuda.synchronize()
    print(f"{forced} D={d} N={n} H={h}: {choice.variant.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
