"""Start-up time of the default kernels with a cold and a warm compile cache (needs a GPU).

    python tests/scripts/startup_time.py                 # bf16 D=64 and float32 D=64, 3 rounds
    python tests/scripts/startup_time.py --cases bfloat16:128 float32:32 --rounds 5

Each measurement is a fresh Python process (the memory cache and the loaded modules live per process) that
runs the local patterns of one case twice and prints the seconds of the first call (kernel selection,
compile or cache read, module load, launches) and of the second (launches only); their difference is the
start-up cost. Per round and case: ``cold``, a new empty HILBERT_HPC_CACHE_DIR (what every rank of every run
paid before the disk cache: it compiled every kernel); ``warm``, the same folder again (what a rank pays once
any rank of the node, or an earlier run, compiled). CuPy's own cache (CUPY_CACHE_DIR) is a new empty folder in
both, so nothing else is cached. On Hopper the defaults are sm_90a cubins (tma16 / wgmma16 and wgmma) plus,
for tma16, the conversion kernels for sm_90.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

N, PATTERNS = 65536, ((2048, 1), (4096, 2), (8192, 4))


def child(dtype: str, d: int) -> dict:
    """Two calls of the case's local patterns in this process: seconds of each."""
    import cupy
    import numpy as np

    from hilbert_hpc.core.patterns import Pattern
    from hilbert_hpc.kernels.providers import provider
    from hilbert_hpc.kernels.selection import choose

    h = max(1, 768 // d)
    patterns = [Pattern(w, r) for w, r in PATTERNS]
    rng = cupy.random.default_rng(3)
    x = [rng.standard_normal((N, h, d), dtype=cupy.float32) for _ in range(3)]
    if dtype != "float32":                                   # 16-bit bits (truncated) held as uint16
        x = [(a.view(cupy.uint32) >> 16).astype(cupy.uint16) if dtype == "bfloat16" else
             a.astype(cupy.float16).view(cupy.uint16) for a in x]
    cupy.cuda.get_current_stream().synchronize()
    times = []
    for _ in range(2):
        out = cupy.zeros((N, h, d), dtype=x[0].dtype)
        lse = cupy.full((N, h), -np.inf, dtype=cupy.float32)
        cupy.cuda.get_current_stream().synchronize()
        t0 = time.perf_counter()
        choice = choose(dtype, d)
        provider(choice).local_patterns(*x, patterns, False, 1.0 / math.sqrt(d), out, lse, shape=(N, h, d))
        cupy.cuda.get_current_stream().synchronize()
        times.append(time.perf_counter() - t0)
    return {"first_s": times[0], "second_s": times[1], "kernel": choice.variant.name}


def measure(dtype: str, d: int, cache: Path, cupy_cache: Path) -> dict:
    """One fresh process for the case with cache folder ``cache``."""
    env = dict(os.environ, HILBERT_HPC_CACHE_DIR=str(cache), CUPY_CACHE_DIR=str(cupy_cache))
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--child", f"{dtype}:{d}"], env=env, check=True,
                          capture_output=True, text=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - t0
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["bfloat16:64", "float32:64"], help="dtype:head_dim")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        dtype, d = args.child.split(":")
        print(json.dumps(child(dtype, int(d))))
        return 0
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    print(f"# {props['name'].decode()}, CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}, "
          f"NVRTC {'.'.join(map(str, cupy.cuda.nvrtc.getVersion()))}, N={N}, patterns {list(PATTERNS)}")
    for case in args.cases:
        dtype, d = case.split(":")
        runs: dict[str, list[dict]] = {"cold": [], "warm": []}
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory() as tmp:
                cache, cupy_cache = Path(tmp) / "cache", Path(tmp) / "cupy"
                runs["cold"].append(measure(dtype, int(d), cache, cupy_cache))
                entries = len(list((cache / "kernels").glob("*.bin")))
                runs["warm"].append(measure(dtype, int(d), cache, Path(tmp) / "cupy-warm"))
        for mode, rs in runs.items():
            startup = [r["first_s"] - r["second_s"] for r in rs]
            first, second, process = (statistics.median(r[k] for r in rs) for k in ("first_s", "second_s", "process_s"))
            print(f"{dtype} D={d} {mode}: start-up {statistics.median(startup):.3f} s (median of {len(rs)}; "
                  f"{' '.join(f'{s:.3f}' for s in startup)}), first call {first:.3f} s, second {second:.4f} s, "
                  f"process {process:.2f} s; {rs[0]['kernel']}"
                  + (f"; {entries} cache entries" if mode == "cold" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
