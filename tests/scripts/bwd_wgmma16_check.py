"""Check of the Hopper 16-bit wgmma backward kernel (dilated_bwd_wgmma_16.cu) on a GPU of compute capability 9.0.

    python3 tests/scripts/bwd_wgmma16_check.py            # every case, then the timing
    python3 tests/scripts/bwd_wgmma16_check.py --quick    # a few cases, then the timing
    python3 tests/scripts/bwd_wgmma16_check.py --no-time  # accuracy only

1. Accuracy: for bfloat16 and float16, D 32/64/96/128, each configuration of the registry, causal and not,
   n = 1024, H = 4, patterns (256,1) (512,2) (1024,4), and a ragged problem (n = 1200, patterns (200,1) (600,2)
   (1200,3): 320, 300 and 400 selected rows, none a multiple of a tile). Inputs, reference and rule as
   tests/scripts/bwd_mma16_check.py: float64 ``local_dilated_backward`` on the rounded inputs, L and delta
   float32, max |err| / max |ref| <= 2e-2 for each of dQ, dK, dV, and finite.
2. Timing (CUDA events, median of 5 after 2 warm-ups): n = 262,144, patterns (2048,1) (4096,2) (8192,4),
   bfloat16, D = 32 (H = 16), D = 64 (H = 12), D = 96 and D = 128 (H = 8), each configuration, non-causal and
   causal, and mma16_bwd (BK = 128) in the same run; useful TFLOP/s with the backward counted as 2.5 x the
   forward's (hilbert_hpc.core.patterns.useful_flops: 4 D per attended pair).

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
from hilbert_hpc.kernels.backward import BackwardKernels  # noqa: E402
from hilbert_hpc.kernels.registry import MMA16_BWD, WGMMA16_BWD, Variant  # noqa: E402
from hilbert_hpc.kernels.selection import KernelChoice  # noqa: E402

TYPES = {"bfloat16": "bf16_t", "float16": "f16_t"}
HEAD_DIMS = (32, 64, 96, 128)
TOLERANCE = 2e-2
EVEN = (1024, 4, [Pattern(256, 1), Pattern(512, 2), Pattern(1024, 4)])
RAGGED = (1200, 4, [Pattern(200, 1), Pattern(600, 2), Pattern(1200, 3)])
ANCHOR = (262144, 12, [Pattern(2048, 1), Pattern(4096, 2), Pattern(8192, 4)])
ANCHOR_128 = (262144, 8, ANCHOR[2])
ANCHOR_32 = (262144, 16, ANCHOR[2])
#: the timing problem of each head dim
TIMED = {32: ANCHOR_32, 64: ANCHOR, 96: ANCHOR_128, 128: ANCHOR_128}


def variant(dtype: str, head_dim: int, config: tuple) -> Variant:
    """The wgmma16_bwd instantiation of ``config`` (NWG, PIPE, STAGES, DQ, LOAD, DKV, BQ); () gives mma16_bwd with BK = 128."""
    if not config:
        return MMA16_BWD.variant(head_dim, dtype, (128,))
    return WGMMA16_BWD.variant(head_dim, dtype, config)


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


def launch_all(v: Variant, dtype: str, arrays: tuple, patterns, causal: bool, scale: float) -> None:
    """Every launch (pattern, head offset) of the backward into the float32 dq, dk, dv of ``arrays``, by the
    package's launcher (``BackwardKernels``) with variant ``v`` forced."""
    BackwardKernels(KernelChoice(dtype, v.head_dim, 90, v)).local_patterns(*arrays, patterns, causal, scale)


def check_case(dtype: str, d: int, cfg: tuple, problem: tuple, causal: bool, seed: int) -> bool:
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
    var = variant(dtype, d, cfg)
    launch_all(var, dtype, arrays, patterns, causal, scale)
    cupy.cuda.Device().synchronize()
    ok, parts = True, []
    for name, got, ref in zip(("dq", "dk", "dv"), grads, want):
        got = cupy.asnumpy(got).astype(np.float64)
        err = float(np.abs(got - ref).max() / np.abs(ref).max()) if np.isfinite(got).all() else math.inf
        ok &= err <= TOLERANCE
        parts.append(f"{name} {err:.2e}")
    print(f"{'ok  ' if ok else 'FAIL'} {dtype:8s} D={d:3d} cfg={cfg} n={n} {'causal' if causal else 'full  '} "
          + "  ".join(parts), flush=True)
    return ok


def time_case(dtype: str, d: int, cfg: tuple, problem: tuple, causal: bool) -> None:
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
    var = variant(dtype, d, cfg)
    arrays = (q, k, v, do, lse, delta, *grads)
    times = []
    for rep in range(7):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        launch_all(var, dtype, arrays, patterns, causal, scale)
        stop.record()
        stop.synchronize()
        if rep >= 2:
            times.append(cupy.cuda.get_elapsed_time(start, stop))
    ms = float(np.median(times))
    tflops = BACKWARD_FLOPS * useful_flops(problem[0], problem[1], d, problem[2], causal) / (ms * 1e-3) / 1e12
    print(f"time {dtype} D={d} {var.variant} {var.config} n={n} H={heads} "
          f"{'causal' if causal else 'full  '}: {ms:.2f} ms, "
          f"{tflops:.0f} TFLOP/s useful", flush=True)


#: configurations to run (--config; empty: every one of the registry)
ONLY: list[tuple] = []


def configs(head_dim: int) -> list[tuple]:
    """The wgmma16_bwd configurations of ``head_dim``: the registry's default, then its alternatives (those of
    ``--config`` only, where given)."""
    return [c for c in WGMMA16_BWD.configurations(head_dim) if not ONLY or c in ONLY]


def cases(quick: bool, dims: tuple = HEAD_DIMS) -> list[tuple]:
    """(dtype, D, configuration, problem, causal) of the accuracy checks of head dims ``dims``."""
    if quick:                            # the first configuration of each head dim (where --config leaves one)
        picks = [("bfloat16", 64, EVEN, False), ("bfloat16", 64, EVEN, True), ("float16", 128, EVEN, True),
                 ("bfloat16", 128, RAGGED, True), ("float16", 64, RAGGED, False), ("float16", 96, RAGGED, True),
                 ("bfloat16", 96, EVEN, False), ("bfloat16", 32, RAGGED, True), ("float16", 32, EVEN, False)]
        return [(dt, d, configs(d)[0], problem, c) for dt, d, problem, c in picks if configs(d) and d in dims]
    full = [(dt, d, w, EVEN, c) for dt in TYPES for d in dims for w in configs(d) for c in (False, True)]
    ragged = [(dt, d, w, RAGGED, c) for dt in TYPES for d in dims for w in configs(d) for c in (False, True)]
    return full + ragged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only a few accuracy cases")
    parser.add_argument("--no-time", action="store_true", help="skip the timing of the large case")
    parser.add_argument("--no-accuracy", action="store_true",
                        help="skip the accuracy cases (the timing's launches come first, e.g. under ncu)")
    parser.add_argument("--config", action="append", default=[],
                        help="only this configuration NWG,PIPE,STAGES,DQ,LOAD,DKV,BQ (repeatable)")
    parser.add_argument("--no-mma16", action="store_true", help="time no mma16_bwd beside them")
    parser.add_argument("--head-dim", type=int, action="append", choices=HEAD_DIMS,
                        help="check and time only these head dims")
    args = parser.parse_args()
    ONLY.extend(tuple(int(x) for x in c.split(",")) for c in args.config)
    cc = int(cupy.cuda.Device().compute_capability)
    if cc != 90:
        print(f"compute capability {cc / 10:.1f}: the wgmma backward needs 9.0 (sm_90a)")
        return 1
    failed = 0
    dims = tuple(args.head_dim or HEAD_DIMS)
    for i, (dtype, d, cfg, problem, causal) in enumerate([] if args.no_accuracy else cases(args.quick, dims)):
        try:
            failed += not check_case(dtype, d, cfg, problem, causal, seed=i)
        except Exception:  # noqa: BLE001 - report the case (compile log included) and go on
            failed += 1
            print(f"FAIL {dtype} D={d} cfg={cfg} n={problem[0]} causal={causal}:\n{traceback.format_exc()}", flush=True)
    if not args.no_time:
        for d, problem in ((d, TIMED[d]) for d in dims):
            for cfg in configs(d) if args.no_mma16 else [(), *configs(d)]:
                for causal in (False, True):
                    try:
                        time_case("bfloat16", d, cfg, problem, causal)
                    except Exception:  # noqa: BLE001
                        failed += 1
                        print(f"FAIL timing D={d} cfg={cfg} causal={causal}:\n{traceback.format_exc()}", flush=True)
    print(f"{failed} case(s) failed" if failed else "all cases passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
