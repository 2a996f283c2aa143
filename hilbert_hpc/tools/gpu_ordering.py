"""Hilbert serialization on the GPU: keys by a CUDA kernel, then a device sort (CuPy).

Bit-identical to :func:`hilbert_hpc.core.ordering.serialization_order` (same keys;
every grid point has a distinct key, so the sort order is unique).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from hilbert_hpc.core.hilbert import MAX_KEY_BITS, bits_for
from hilbert_hpc.kernels.program import Program, load

MAX_DIMS = 16
THREADS = 256
#: the key kernel (``extern "C" hilbert_keys``), compiled for the device's sm_XY
KEYS_PROGRAM = Program("hilbert_keys.cu")


def _kernel() -> Any:
    """The key kernel on the current device (compiled and loaded once per device)."""
    return load(KEYS_PROGRAM).function("hilbert_keys")


def gpu_hilbert_keys(grid: Sequence[int]) -> Any:
    """uint64 Hilbert keys (CuPy array) of every point of ``grid`` in natural order."""
    import cupy

    dims = tuple(int(g) for g in grid)
    if not 1 <= len(dims) <= MAX_DIMS:
        raise ValueError(f"the GPU Hilbert kernel takes 1 to {MAX_DIMS} axes, got {len(dims)}")
    bits = max(bits_for(g) for g in dims)
    if bits * len(dims) > MAX_KEY_BITS:
        raise ValueError(f"grid {list(dims)} is too large for {MAX_KEY_BITS}-bit Hilbert keys")
    n = int(np.prod(dims))
    keys = cupy.empty(n, dtype=cupy.uint64)
    extents = cupy.asarray(dims, dtype=cupy.int64)
    _kernel()((-(-n // THREADS),), (THREADS,), (np.int64(n), np.int32(len(dims)), np.int32(bits), extents, keys))
    return keys


def gpu_serialization_order(grid: Sequence[int]) -> Any:
    """The ``hilbert`` permutation of ``grid`` as a CuPy int64 array (``perm[s]`` = natural index)."""
    import cupy

    return cupy.argsort(gpu_hilbert_keys(grid)).astype(cupy.int64)


def serialization_cost(grid: Sequence[int], heads: int, head_dim: int, patterns: Sequence, repeats: int = 5) -> dict:
    """Median seconds of Hilbert keys, sort, and permuting Q/K/V on the GPU, and of fused attention."""
    import time

    import cupy

    from hilbert_hpc.backends import get_backend
    from hilbert_hpc.core.patterns import parse_patterns

    n = int(np.prod(grid))
    pats = parse_patterns(patterns)
    rng = cupy.random.default_rng(0)
    q, k, v = (rng.standard_normal((n, heads, head_dim), dtype=cupy.float32) for _ in range(3))
    stream = cupy.cuda.get_current_stream()
    fused = get_backend("cuda-fp32")

    def timed(fn):
        out, times = None, []
        for _ in range(repeats + 1):
            stream.synchronize()
            t0 = time.perf_counter()
            out = fn()
            stream.synchronize()
            times.append(time.perf_counter() - t0)
        return out, float(np.median(times[1:]))

    keys, t_keys = timed(lambda: gpu_hilbert_keys(grid))
    perm, t_sort = timed(lambda: cupy.argsort(keys))
    qs, t_perm = timed(lambda: [x[perm] for x in (q, k, v)])
    _, t_att = timed(lambda: fused.serialized_attention(*qs, pats, False, 1.0 / np.sqrt(head_dim)))
    total = t_keys + t_sort + t_perm
    return {"tokens": n, "keys_s": t_keys, "sort_s": t_sort, "permute_s": t_perm, "attention_s": t_att,
            "serialization_share": total / t_att}


def main() -> int:
    """Print the Hilbert serialization cost against fused attention for LongNet-style 1M and 4M problems."""
    for grid in ((1024, 1024), (2048, 2048)):
        n = grid[0] * grid[1]
        pats = [(2048, 1), (8192, 4), (32768, 16), (n, n // 2048)]
        r = serialization_cost(grid, 8, 64, pats)
        print(f"grid {grid[0]}x{grid[1]} N={n:,} H=8 D=64 patterns {pats}: keys {r['keys_s'] * 1e3:.2f} ms, "
              f"sort {r['sort_s'] * 1e3:.2f} ms, permute Q/K/V {r['permute_s'] * 1e3:.2f} ms, "
              f"attention {r['attention_s'] * 1e3:.1f} ms, serialization / attention = {r['serialization_share']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
