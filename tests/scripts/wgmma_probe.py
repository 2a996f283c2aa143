"""Probe of the Hopper wgmma FP32 kernel on an H100/H200: accuracy against float64, then speed against tf32x3.

    python3 tests/scripts/wgmma_probe.py            # about half a minute on an H200
    python3 tests/scripts/wgmma_probe.py --quick    # accuracy and the D=64 anchor only
    python3 tests/scripts/wgmma_probe.py --long     # also 4,096-token segments in the accuracy part

1. For every head dimension (32, 64, 96, 128), causal and not: random problems through
   ``provider(choose("float32", D)).local_patterns`` (``hilbert_hpc.kernels``) with ``HILBERT_HPC_FP32_KERNEL=wgmma`` (and tf32x3 for comparison)
   against the float64 dense reference (tests/dense_reference.py): relative L2 error (the project's measure)
   and the largest element error relative to max |reference|.
2. Timing (CUDA events, median of 5 after 2 warm-ups) of wgmma and tf32x3 on the anchor
   (N = 262,144, H = 12, D = 64, patterns (2048,1) (4096,2) (8192,4), scale 1/sqrt(D)) and on D = 128,
   H = 8, non-causal and causal; then the other wgmma block configurations (forced as HILBERT_HPC_FP32_KERNEL=wgmma:BK,WG,PARTS; defaults: kernels/registry.py) for D = 64
   and D = 128, to choose the defaults.

A variant that fails to compile or launch prints its error (with the NVRTC log) and the probe goes on.
Exit code 1 when any wgmma error exceeds 1e-6 or wgmma failed; 0 otherwise.
"""

from __future__ import annotations

import math
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import cupy  # noqa: E402

from dense_reference import dense_dilated_attention  # noqa: E402
from hilbert_hpc.kernels import program, registry  # noqa: E402
from hilbert_hpc.kernels.providers import provider  # noqa: E402
from hilbert_hpc.kernels.selection import choose  # noqa: E402
from hilbert_hpc.kernels.selection import FP32_ENV  # noqa: E402
from hilbert_hpc.core.patterns import Pattern  # noqa: E402

TOL = 1e-6
ANCHOR = [Pattern(2048, 1), Pattern(4096, 2), Pattern(8192, 4)]
#: alternative wgmma configurations (key tile, warpgroups, column parts) timed after the defaults
ALTERNATIVES = {32: [(64, 1, 1), (64, 2, 1), (32, 2, 1), (128, 1, 1)], 64: [(32, 1, 1), (64, 2, 1), (64, 2, 2), (32, 2, 1)],
                96: [(32, 2, 2), (32, 2, 1)], 128: [(32, 2, 2), (32, 2, 4)]}


def forced(variant: str, cfg: tuple) -> str:
    """The HILBERT_HPC_FP32_KERNEL value forcing ``variant`` with configuration ``cfg``."""
    return f"{variant}:{','.join(map(str, cfg))}"


def run(variant: str, q, k, v, patterns, causal: bool):
    """Output of local_patterns with ``variant`` forced (CuPy arrays in, CuPy array out)."""
    os.environ[FP32_ENV] = variant
    n, h, d = q.shape
    out = cupy.zeros((n, h, d), dtype=cupy.float32)
    lse = cupy.full((n, h), -np.inf, dtype=cupy.float32)
    provider(choose("float32", d)).local_patterns(q, k, v, patterns, causal, 1.0 / math.sqrt(d), out, lse)
    return out


def describe_failure(variant: str, head_dim: int, exc: BaseException) -> str:
    text = f"{variant} D={head_dim}: {type(exc).__name__}: {exc}"
    if variant == "wgmma":          # the NVRTC log of the sm_90a compile, when it compiles
        try:
            v = registry.family(variant).variant(head_dim)
            _, _, log = program.compile_cubin(v)
            if log.strip():
                text += f"\n  NVRTC log: {log.strip()[:2000]}"
        except Exception as exc2:  # noqa: BLE001 - the compile error itself (with its log)
            text += f"\n  compile: {exc2}"
    return text


def accuracy(quick: bool) -> tuple[bool, list[str]]:
    ok, failures = True, []
    problems = [(2048, 2, [Pattern(512, 1), Pattern(2048, 2)]),          # tiles divide evenly
                (3000, 3, [Pattern(1000, 1), Pattern(3000, 3)])]          # ragged tiles and blocks
    if "--long" in sys.argv:
        problems.append((4096, 2, [Pattern(512, 1), Pattern(2048, 2), Pattern(4096, 8)]))
    print(f"accuracy vs float64 (relative L2 error | max element error / max |ref|), tolerance {TOL:g}")
    for d in registry.HEAD_DIMS:
        for causal in (False, True):
            for pi, (n, h, pats) in enumerate(problems):
                rng = np.random.default_rng(1000 * d + 10 * pi + causal)
                host = [rng.standard_normal((n, h, d)).astype(np.float32) for _ in range(3)]
                want = dense_dilated_attention(*(x.astype(np.float64) for x in host),
                                               [(p.segment, p.dilation) for p in pats], causal)
                dev = [cupy.asarray(x) for x in host]
                line = f"  D={d:3d} causal={int(causal)} n={n} H={h} {' '.join(map(str, pats)):22s}"
                for name in ("wgmma", "tf32x3"):
                    try:
                        got = cupy.asnumpy(run(name, *dev, pats, causal)).astype(np.float64)
                    except Exception as exc:  # noqa: BLE001 - report and go on
                        msg = describe_failure(name, d, exc)
                        if msg not in failures:
                            failures.append(msg)
                        line += f" | {name} FAILED"
                        ok = ok and name != "wgmma"
                        continue
                    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
                    mx = float(np.abs(got - want).max() / np.abs(want).max())
                    bad = not np.isfinite(got).all() or rel > TOL
                    if name == "wgmma" and bad:
                        ok = False
                    line += f" | {name} {rel:.2e} {mx:.2e}{' BAD' if bad else ''}"
                print(line, flush=True)
    return ok, failures


def time_case(variant: str, q, k, v, patterns, causal: bool, reps: int = 5, warm: int = 2) -> float:
    """Median milliseconds of local_patterns with ``variant`` (CUDA events)."""
    os.environ[FP32_ENV] = variant
    n, h, d = q.shape
    out = cupy.zeros((n, h, d), dtype=cupy.float32)
    lse = cupy.full((n, h), -np.inf, dtype=cupy.float32)
    kernels = provider(choose("float32", d))        # chosen once, outside the timed calls
    times = []
    for i in range(warm + reps):
        out.fill(0)
        lse.fill(-np.inf)
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        kernels.local_patterns(q, k, v, patterns, causal, 1.0 / math.sqrt(d), out, lse)
        stop.record()
        stop.synchronize()
        if i >= warm:
            times.append(cupy.cuda.get_elapsed_time(start, stop))
    return float(np.median(times))


def useful_tflops(n: int, h: int, d: int, patterns, causal: bool, ms: float) -> float:
    """Useful TFLOP/s as the results files count them (hilbert_hpc.core.patterns.useful_flops: 4 D per attended
    pair; a pattern of dilation r selects 1/r of the queries of each head, each seeing w/r keys)."""
    from hilbert_hpc.core.patterns import useful_flops

    return useful_flops(n, h, d, patterns, causal) / ms / 1e9


def timing(quick: bool) -> tuple[bool, list[str]]:
    ok, failures = True, []
    cases = [(262144, 12, 64)] + ([] if quick else [(262144, 8, 128)])
    print("timing: median of 5 after 2 warm-ups, CUDA events, patterns (2048,1) (4096,2) (8192,4)")
    for n, h, d in cases:
        cp_rng = cupy.random.default_rng(7)
        q, k, v = (cp_rng.standard_normal((n, h, d), dtype=cupy.float32) for _ in range(3))
        for causal in (False, True):
            res = {}
            for name in ("tf32x3", "wgmma"):
                try:
                    res[name] = time_case(name, q, k, v, ANCHOR, causal)
                except Exception as exc:  # noqa: BLE001
                    msg = describe_failure(name, d, exc)
                    if msg not in failures:
                        failures.append(msg)
                    ok = ok and name != "wgmma"
            cells = " ".join(f"{k_}={t:7.2f} ms ({useful_tflops(n, h, d, ANCHOR, causal, t):5.1f} TFLOP/s)"
                             for k_, t in res.items())
            speed = f" speedup {res['tf32x3'] / res['wgmma']:.2f}x" if len(res) == 2 else ""
            print(f"  N={n} H={h:2d} D={d:3d} causal={int(causal)} {cells}{speed}", flush=True)
        if not quick and d in ALTERNATIVES:
            default = registry.WGMMA.defaults[d]
            for cfg in ALTERNATIVES[d]:
                try:
                    t = time_case(forced("wgmma", cfg), q, k, v, ANCHOR, False, reps=3, warm=1)
                    print(f"    wgmma (key tile, warpgroups, parts) = {cfg}{' default' if cfg == default else ''}: "
                          f"{t:7.2f} ms, {registry.WGMMA.variant(d, config=cfg).shared_bytes} bytes shared",
                          flush=True)
                except Exception as exc:  # noqa: BLE001
                    print(f"    wgmma {cfg}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        del q, k, v
        cupy.get_default_memory_pool().free_all_blocks()
    return ok, failures


def sweep() -> bool:
    """Every configuration of ALTERNATIVES: agreement with tf32x3 on a ragged problem (causal and not),
    then time on N=262,144 with H*D = 768, non-causal and causal (median of 5 after 2 warm-ups)."""
    ok = True
    print("sweep: (key tile, warpgroups, column parts); max |wgmma - tf32x3| / max |tf32x3|; ms non-causal, causal")
    for d, configs in ALTERNATIVES.items():
        rng = cupy.random.default_rng(11)
        small = [rng.standard_normal((3000, 3, d), dtype=cupy.float32) for _ in range(3)]
        small_pat = [Pattern(1000, 1), Pattern(3000, 3)]
        n, h = 262144, 768 // d
        big = [rng.standard_normal((n, h, d), dtype=cupy.float32) for _ in range(3)]
        ref = {c: run("tf32x3", *small, small_pat, c) for c in (False, True)}
        base = [time_case("tf32x3", *big, ANCHOR, c) for c in (False, True)]
        print(f"  D={d:3d} H={h:2d} tf32x3: {base[0]:7.2f} {base[1]:7.2f} ms", flush=True)
        default = registry.WGMMA.defaults[d]
        for cfg in configs:
            try:
                err = max(float(cupy.abs(run(forced("wgmma", cfg), *small, small_pat, c) - ref[c]).max()
                                / cupy.abs(ref[c]).max()) for c in (False, True))
                t = [time_case(forced("wgmma", cfg), *big, ANCHOR, c) for c in (False, True)]
                ok = ok and err <= TOL
                print(f"    {cfg}{' default' if cfg == default else '        '} diff {err:.1e}  {t[0]:7.2f} {t[1]:7.2f} ms"
                      f"  speedup {base[0] / t[0]:.2f}x {base[1] / t[1]:.2f}x  "
                      f"({useful_tflops(n, h, d, ANCHOR, False, t[0]):.1f} TFLOP/s)", flush=True)
            except Exception as exc:  # noqa: BLE001
                ok = False
                print(f"    {cfg}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        del small, big
        cupy.get_default_memory_pool().free_all_blocks()
    return ok


def main() -> int:
    if "--sweep" in sys.argv:
        return 0 if sweep() else 1
    quick = "--quick" in sys.argv
    t0 = time.time()
    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    cc = int(dev.compute_capability)
    print(f"device {props['name'].decode()} cc {cc / 10:.1f}, CuPy {cupy.__version__}, CUDA runtime "
          f"{cupy.cuda.runtime.runtimeGetVersion()}, NVRTC {'.'.join(map(str, cupy.cuda.nvrtc.getVersion()))}")
    if cc != 90:
        print("wgmma needs compute capability 9.0 (sm_90a): nothing to probe here")
        return 1
    for d in registry.HEAD_DIMS:
        v = registry.WGMMA.variant(d)
        print(f"  wgmma D={d}: {v.name}, {v.threads} threads, {v.block_queries} queries, {v.shared_bytes} bytes shared")
    ok_a, fail_a = accuracy(quick)
    print(f"accuracy done in {time.time() - t0:.1f} s", flush=True)
    ok_t, fail_t = timing(quick)
    for msg in dict.fromkeys(fail_a + fail_t):
        print("FAILURE:", msg)
    ok = ok_a and ok_t
    print(f"{'PASS' if ok else 'FAIL'}: wgmma relative error <= {TOL:g} everywhere: {ok_a}; "
          f"total {time.time() - t0:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001 - print everything, exit 1
        traceback.print_exc()
        sys.exit(1)
