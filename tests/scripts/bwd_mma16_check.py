"""Check of the 16-bit mma.sync backward kernel (dilated_bwd_mma_16.cu) on a GPU of compute capability 8.0+.

    python3 tests/scripts/bwd_mma16_check.py            # every case, then the timing
    python3 tests/scripts/bwd_mma16_check.py --quick    # a few cases, then the timing
    python3 tests/scripts/bwd_mma16_check.py --no-time  # accuracy only

1. Accuracy: for bfloat16 and float16, D 32/64/96/128, BK 64 and 128, causal and not, n = 1024, H = 4,
   patterns (256,1) (512,2) (1024,4), and a ragged problem (n = 1200, patterns (200,1) (600,2) (1200,3):
   320, 300 and 400 selected rows, none a multiple of a tile). Inputs are float32 from numpy rounded to
   16 bits (float16 by cupy, bfloat16 in numpy, round to nearest even); the reference is
   ``hilbert_hpc.core.backward.local_dilated_backward`` in float64 on the rounded inputs, with O and L from
   ``hilbert_hpc.core.dilated.local_dilated_forward`` in float64, delta = rowsum(dO * O) in float64. The kernel
   gets L and delta as float32 and adds its terms to float32 zeros, one launch per pattern and head offset
   (``hilbert_hpc.kernels.launch.local_launches``), grid (segments * heads, ceil(mk / BK)).
   Rule: max |err| / max |ref| <= 2e-2 for each of dQ, dK, dV, and finite.
2. Timing (CUDA events, median of 5 after 2 warm-ups): n = 262,144, H = 12, D = 64, patterns (2048,1)
   (4096,2) (8192,4), bfloat16, BK 64 and 128, non-causal and causal; useful TFLOP/s with the backward
   counted as 2.5 x the forward's (hilbert_hpc.core.patterns.useful_flops: 4 D per attended pair).

Exit code 1 when any case fails (or fails to compile or launch); 0 otherwise.
"""

from __future__ import annotations

import argparse
import math
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import cupy  # noqa: E402
import numpy as np  # noqa: E402

from hilbert_hpc.core.backward import local_dilated_backward  # noqa: E402
from hilbert_hpc.core.dilated import local_dilated_forward  # noqa: E402
from hilbert_hpc.core.patterns import BACKWARD_FLOPS, Pattern, useful_flops  # noqa: E402
from hilbert_hpc.kernels.launch import geometry_arguments, local_launches  # noqa: E402
from hilbert_hpc.kernels.program import compiled  # noqa: E402
from hilbert_hpc.kernels.registry import MMA16_BWD, Variant  # noqa: E402

TYPES = ("bfloat16", "float16")
HEAD_DIMS = (32, 64, 96, 128)
KEY_BLOCKS = (64, 128)
TOLERANCE = 2e-2
EVEN = (1024, 4, [Pattern(256, 1), Pattern(512, 2), Pattern(1024, 4)])
RAGGED = (1200, 4, [Pattern(200, 1), Pattern(600, 2), Pattern(1200, 3)])
ANCHOR = (262144, 12, [Pattern(2048, 1), Pattern(4096, 2), Pattern(8192, 4)])


def variant(dtype: str, head_dim: int, bk: int) -> Variant:
    """The registry's instantiation for (dtype, head dim, keys per block)."""
    return MMA16_BWD.variant(head_dim, dtype, (bk,))


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), rounded to nearest even (finite inputs)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) -> float32 values."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def sixteen_bit(x: np.ndarray, dtype: str) -> tuple[cupy.ndarray, np.ndarray]:
    """(device array of the 16-bit values, the same values in float64 on the host)."""
    if dtype == "float16":
        dev = cupy.asarray(x, dtype=cupy.float32).astype(cupy.float16)
        return dev, cupy.asnumpy(dev).astype(np.float64)
    bits = to_bf16(x)
    return cupy.asarray(bits), from_bf16(bits).astype(np.float64)


def launch_all(fn, v: Variant, bk: int, arrays: tuple, patterns, causal: bool, scale: float, n: int, heads: int,
               d: int) -> None:
    """Every launch (pattern, head offset) of the backward into the float32 dq, dk, dv of ``arrays``."""
    ptrs = tuple(np.uint64(a.data.ptr) for a in arrays)
    for g in local_launches(patterns, causal, scale, n, heads, d):
        grid = (g["segments"] * g["heads"], -(-g["mk"] // bk))
        args = (*ptrs, *geometry_arguments(g["qg"], g["kg"], g["vg"], g["lg"], g["heads"], g["mq"], g["mk"],
                                           g["shift"], scale))
        fn(grid, (v.threads,), args, shared_mem=v.shared_bytes)


def check_case(dtype: str, d: int, bk: int, problem: tuple, causal: bool, seed: int) -> bool:
    """One accuracy case; prints its errors; True when it passes."""
    n, heads, patterns = problem
    rng = np.random.default_rng(seed)
    scale = 1.0 / math.sqrt(d)
    host = [rng.standard_normal((n, heads, d)).astype(np.float32) for _ in range(4)]
    (q, q64), (k, k64), (v, v64), (do, do64) = (sixteen_bit(x, dtype) for x in host)
    out, lse = local_dilated_forward(q64, k64, v64, patterns, causal, scale)
    want = local_dilated_backward(q64, k64, v64, out, lse, do64, patterns, causal, scale)
    delta = np.einsum("nhd,nhd->nh", do64, out)
    grads = tuple(cupy.zeros((n, heads, d), dtype=cupy.float32) for _ in range(3))
    arrays = (q, k, v, do, cupy.asarray(lse, dtype=cupy.float32), cupy.asarray(delta, dtype=cupy.float32), *grads)
    var = variant(dtype, d, bk)
    launch_all(compiled(var), var, bk, arrays, patterns, causal, scale, n, heads, d)
    cupy.cuda.Device().synchronize()
    ok, parts = True, []
    for name, got, ref in zip(("dq", "dk", "dv"), grads, want):
        got = cupy.asnumpy(got).astype(np.float64)
        err = float(np.abs(got - ref).max() / np.abs(ref).max()) if np.isfinite(got).all() else math.inf
        ok &= err <= TOLERANCE
        parts.append(f"{name} {err:.2e}")
    print(f"{'ok  ' if ok else 'FAIL'} {dtype:8s} D={d:3d} BK={bk:3d} n={n} {'causal' if causal else 'full  '} "
          + "  ".join(parts), flush=True)
    return ok


def time_case(dtype: str, d: int, bk: int, problem: tuple, causal: bool) -> None:
    """Median time of the backward launches of ``problem`` (random inputs, L = 10, delta small)."""
    n, heads, patterns = problem
    scale = 1.0 / math.sqrt(d)
    rs = cupy.random.RandomState(0)
    def bits():  # bfloat16 bits of standard normal values, on the GPU
        u = rs.standard_normal((n, heads, d), dtype=cupy.float32).view(cupy.uint32).astype(cupy.uint64)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(cupy.uint16)
    q, k, v, do = bits(), bits(), bits(), bits()
    lse = cupy.full((n, heads), 10.0, dtype=cupy.float32)
    delta = (0.1 * rs.standard_normal((n, heads), dtype=cupy.float32)).astype(cupy.float32)
    grads = tuple(cupy.zeros((n, heads, d), dtype=cupy.float32) for _ in range(3))
    var = variant(dtype, d, bk)
    fn = compiled(var)
    arrays = (q, k, v, do, lse, delta, *grads)
    times = []
    for rep in range(7):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        launch_all(fn, var, bk, arrays, patterns, causal, scale, n, heads, d)
        stop.record()
        stop.synchronize()
        if rep >= 2:
            times.append(cupy.cuda.get_elapsed_time(start, stop))
    ms = float(np.median(times))
    tflops = BACKWARD_FLOPS * useful_flops(problem[0], problem[1], d, problem[2], causal) / (ms * 1e-3) / 1e12
    print(f"time {dtype} D={d} BK={bk} n={n} H={heads} {'causal' if causal else 'full  '}: {ms:.2f} ms, "
          f"{tflops:.0f} TFLOP/s useful", flush=True)


def cases(quick: bool) -> list[tuple]:
    """(dtype, D, BK, problem, causal) of the accuracy checks."""
    if quick:
        return [("bfloat16", 64, 64, EVEN, False), ("bfloat16", 64, 64, EVEN, True),
                ("float16", 128, 128, EVEN, True), ("bfloat16", 96, 128, RAGGED, True),
                ("float16", 32, 64, RAGGED, False)]
    full = [(dt, d, bk, EVEN, c) for dt in TYPES for d in HEAD_DIMS for bk in KEY_BLOCKS for c in (False, True)]
    ragged = [(dt, d, bk, RAGGED, c) for dt in TYPES for d in (32, 128) for bk in KEY_BLOCKS for c in (False, True)]
    return full + ragged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only a few accuracy cases")
    parser.add_argument("--no-time", action="store_true", help="skip the timing of the large case")
    args = parser.parse_args()
    cc = int(cupy.cuda.Device().compute_capability)
    if cc < 80:
        print(f"compute capability {cc / 10:.1f}: the mma.sync backward needs 8.0 or newer")
        return 1
    failed = 0
    for i, (dtype, d, bk, problem, causal) in enumerate(cases(args.quick)):
        try:
            failed += not check_case(dtype, d, bk, problem, causal, seed=i)
        except Exception:  # noqa: BLE001 - report the case (compile log included) and go on
            failed += 1
            print(f"FAIL {dtype} D={d} BK={bk} n={problem[0]} causal={causal}:\n{traceback.format_exc()}", flush=True)
    if not args.no_time:
        for bk in KEY_BLOCKS:
            for causal in (False, True):
                try:
                    time_case("bfloat16", 64, bk, ANCHOR, causal)
                except Exception:  # noqa: BLE001
                    failed += 1
                    print(f"FAIL timing BK={bk} causal={causal}:\n{traceback.format_exc()}", flush=True)
    print(f"{failed} case(s) failed" if failed else "all cases passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
