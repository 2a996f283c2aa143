"""Probe of the Hopper 16-bit (bfloat16 / float16) kernels on an H100/H200: accuracy, then speed.

    python3 tests/scripts/wgmma16_probe.py            # under a minute on an H200
    python3 tests/scripts/wgmma16_probe.py --quick    # accuracy and the D=64 bf16 timing only
    python3 tests/scripts/wgmma16_probe.py --sweep    # also time every configuration of the wgmma16
                                                      # and tma16 alternatives (kernels/registry.py)
    python3 tests/scripts/wgmma16_probe.py --variants tma16   # only these Hopper variants (default: both)

Each Hopper variant (``wgmma16``, and ``tma16`` where it has the head dim) is probed in turn, forced through
HILBERT_HPC_HALF_KERNEL.

1. For bfloat16 and float16, head dims 32, 64, 96, 128, causal and not, an evenly tiled and a ragged problem:
   inputs made by torch in 16 bits on the GPU, ``hilbert_hpc.kernels.sixteen_bit.launch_local_patterns`` into
   out = zeros (16-bit) and lse = -inf (float32), against a float64 dense reference computed (torch, on the
   GPU) from the SAME 16-bit inputs. Printed: max |err| / max |ref| of ours and of the PyTorch peer
   (``hilbert_hpc.backends.torch_peer.TorchPeer.serialized_attention`` in the same 16-bit dtype), and the relative L2
   errors. Rule (FlashAttention's): ours <= 2x the peer's max error, and finite. The alternative
   configurations (V transposed into K-major shared memory, other key tiles) are checked on one ragged
   problem as a diagnostic: if only the default (V as MN-major B, imm-trans-b) fails, the MN-major
   descriptor is the suspect.
2. Timing (CUDA events, median of 5 after 2 warm-ups) against the peer: N = 262,144, H = 12, D = 64 and
   H = 8, D = 128, patterns (2048,1) (4096,2) (8192,4), non-causal and causal: ms, speedup, useful TFLOP/s
   (4 N (w / r) D H per pattern, halved when causal).

A case that fails to compile or launch prints its error with the NVRTC log and the probe goes on.
Exit code 1 when any error rule fails or any case failed; 0 otherwise.
"""

from __future__ import annotations

import math
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from hilbert_hpc.backends.torch_peer import TorchPeer  # noqa: E402
from hilbert_hpc.kernels import program, registry, sixteen_bit  # noqa: E402
from hilbert_hpc.kernels.selection import SIXTEEN_BIT_ENV, choose  # noqa: E402
from hilbert_hpc.core.patterns import Pattern  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
ANCHOR = [Pattern(2048, 1), Pattern(4096, 2), Pattern(8192, 4)]
PROBLEMS = [(2048, 2, [Pattern(512, 1), Pattern(2048, 2)]),          # tiles divide evenly
            (3000, 3, [Pattern(1000, 1), Pattern(3000, 3)])]          # ragged tiles and blocks
FACTOR = 2.0


def dense_reference(q, k, v, patterns, causal: bool, scale: float) -> torch.Tensor:
    """Float64 dense dilated attention (the multiset softmax of tests/dense_reference.py), on the GPU."""
    q, k, v = (x.double() for x in (q, k, v))
    n, heads, _ = q.shape
    s = torch.arange(n, device=q.device)
    out = torch.zeros_like(v)
    for h in range(heads):
        mult = torch.zeros((n, n), dtype=torch.float64, device=q.device)
        for p in patterns:
            w, r = p.segment, p.dilation
            seg = s // w
            sel = (s - seg * w) % r == h % r
            both = sel[:, None] & sel[None, :] & (seg[:, None] == seg[None, :])
            if causal:
                both &= s[None, :] <= s[:, None]
            mult += both
        scores = q[:, h] @ k[:, h].T * scale
        live = mult > 0
        mx = torch.where(live, scores, -math.inf).amax(dim=1, keepdim=True)
        mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
        weights = mult * torch.exp(torch.where(live, scores - mx, -math.inf))
        den = weights.sum(dim=1, keepdim=True)
        out[:, h] = torch.where(den > 0, weights @ v[:, h] / torch.where(den > 0, den, torch.ones_like(den)), 0.0)
    return out


def ours(q, k, v, patterns, causal: bool, scale: float, out=None, lse=None) -> torch.Tensor:
    n, h, d = q.shape
    if out is None:
        out = torch.zeros((n, h, d), dtype=q.dtype, device=q.device)
        lse = torch.full((n, h), -math.inf, dtype=torch.float32, device=q.device)
    sixteen_bit.launch_local_patterns(q.data_ptr(), k.data_ptr(), v.data_ptr(), patterns, causal, scale,
                               out.data_ptr(), lse.data_ptr(), shape=(n, h, d), dtype=str(q.dtype))
    return out


def ours_rounded(q, k, v, patterns, causal: bool, scale: float, out, lse) -> torch.Tensor:
    """The same launches with the 16-bit output rounded after every launch (no float32 running output)."""
    n, h, d = q.shape
    choice = choose(str(q.dtype), d)
    sixteen_bit.sixteen_bit_kernels(choice).rounding.local_patterns(q.data_ptr(), k.data_ptr(), v.data_ptr(), patterns,
                                                                    causal, scale, out.data_ptr(), lse.data_ptr(),
                                                                    shape=(n, h, d))
    return out


def describe_failure(what: str, head_dim: int, dtype: str, exc: BaseException) -> str:
    text = f"{what} D={head_dim} {dtype}: {type(exc).__name__}: {exc}"
    try:                                   # the NVRTC log of the sm_90a compile, when it compiles
        v = choose(dtype, head_dim).variant
        _, _, log = program.compile_cubin(v)
        if log.strip():
            text += f"\n  NVRTC log: {log.strip()[:2000]}"
    except Exception as exc2:  # noqa: BLE001 - the compile error itself (with its log)
        text += f"\n  compile: {str(exc2)[:3000]}"
    return text


def errors(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    diff = got.double() - want
    mx = float(diff.abs().max() / want.abs().max())
    rel = float(diff.norm() / want.norm())
    return (mx if torch.isfinite(got.double()).all() else math.inf), rel


def variant_dims(variant: str) -> tuple[int, ...]:
    return registry.family(variant).head_dims


def accuracy(quick: bool, variant: str) -> tuple[bool, list[str]]:
    ok, failures = True, []
    os.environ[SIXTEEN_BIT_ENV] = variant
    print(f"{variant}: accuracy vs float64 from the same 16-bit inputs: max |err| / max |ref| (and relative L2) "
          f"of ours and of the PyTorch peer; rule ours <= {FACTOR:g}x peer")
    for dname, dt in DTYPES.items():
        for d in variant_dims(variant):
            for causal in (False, True):
                for pi, (n, h, pats) in enumerate(PROBLEMS):
                    g = torch.Generator(device="cuda").manual_seed(1000 * d + 10 * pi + causal)
                    q, k, v = (torch.randn((n, h, d), generator=g, device="cuda", dtype=torch.float32).to(dt)
                               for _ in range(3))
                    scale = 1.0 / math.sqrt(d)
                    want = dense_reference(q, k, v, pats, causal, scale)
                    peer = TorchPeer().serialized_attention(q, k, v, pats, causal, scale)
                    pm, pr = errors(peer, want)
                    line = (f"  {dname:8s} D={d:3d} causal={int(causal)} n={n} H={h} {' '.join(map(str, pats)):18s}"
                            f" | peer {pm:.2e} ({pr:.2e})")
                    try:
                        got = ours(q, k, v, pats, causal, scale)
                        torch.cuda.synchronize()
                    except Exception as exc:  # noqa: BLE001 - report and go on
                        msg = describe_failure(variant, d, dname, exc)
                        if msg not in failures:
                            failures.append(msg)
                        print(line + " | ours FAILED", flush=True)
                        ok = False
                        continue
                    om, orl = errors(got, want)
                    bad = not om <= FACTOR * pm
                    ok = ok and not bad
                    print(line + f" | ours {om:.2e} ({orl:.2e}) ratio {om / pm:.2f}{' BAD' if bad else ''}", flush=True)
    os.environ.pop(SIXTEEN_BIT_ENV, None)
    if not quick:
        ok_d = diagnostics(variant)
        ok = ok and ok_d
    return ok, failures


def configurations(variant: str, d: int) -> list[tuple]:
    return registry.family(variant).configurations(d)


def diagnostics(variant: str) -> bool:
    """Every alternative configuration on the ragged problem, causal and not (bf16 and fp16)."""
    ok = True
    n, h, pats = PROBLEMS[1]
    print(f"{variant} configurations on the ragged problem: max |err| / max |ref|, causal 0 and 1 "
          "(wgmma16 (BK, WG, VMODE), VMODE 0: V MN-major via imm-trans-b; 1: V transposed into K-major shared "
          "memory; tma16 (BK, NC, STAGES, PIPE, LAZY, PINGPONG, PERSISTENT))")
    for dname, dt in DTYPES.items():
        for d in variant_dims(variant):
            cells = []
            for cfg in configurations(variant, d):
                os.environ[SIXTEEN_BIT_ENV] = f"{variant}:{','.join(map(str, cfg))}"
                res = []
                try:
                    for causal in (False, True):
                        g = torch.Generator(device="cuda").manual_seed(77 + d + causal)
                        q, k, v = (torch.randn((n, h, d), generator=g, device="cuda").to(dt) for _ in range(3))
                        scale = 1.0 / math.sqrt(d)
                        want = dense_reference(q, k, v, pats, causal, scale)
                        pm, _ = errors(TorchPeer().serialized_attention(q, k, v, pats, causal, scale), want)
                        om, _ = errors(ours(q, k, v, pats, causal, scale), want)
                        ok = ok and om <= FACTOR * pm
                        res.append(f"{om:.1e}{'!' if not om <= FACTOR * pm else ''}")
                    cells.append(f"{cfg}: {' '.join(res)}")
                except Exception as exc:  # noqa: BLE001
                    ok = False
                    cells.append(f"{cfg}: FAILED {type(exc).__name__}: {str(exc)[:400]}")
                finally:
                    os.environ.pop(SIXTEEN_BIT_ENV, None)
            print(f"  {dname:8s} D={d:3d} " + " | ".join(cells), flush=True)
    return ok


def time_ms(fn, reps: int = 5, warm: int = 2, reset=None) -> float:
    times = []
    for i in range(warm + reps):
        if reset is not None:
            reset()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        if i >= warm:
            times.append(start.elapsed_time(stop))
    return sorted(times)[len(times) // 2]


def useful_tflops(n: int, h: int, d: int, patterns, causal: bool, ms: float) -> float:
    """Useful TFLOP/s as the results files count them (hilbert_hpc.core.patterns.useful_flops: 4 D per attended
    pair; a pattern of dilation r selects 1/r of the queries of each head, each seeing w/r keys)."""
    from hilbert_hpc.core.patterns import useful_flops

    return useful_flops(n, h, d, patterns, causal) / ms / 1e9


def timing(quick: bool, sweep: bool, variants: list[str]) -> tuple[bool, list[str]]:
    ok, failures = True, []
    cases = [(262144, 12, 64)] + ([] if quick else [(262144, 8, 128)])
    dtypes = ["bfloat16"] if quick else list(DTYPES)
    print("timing: median of 5 after 2 warm-ups, CUDA events, patterns (2048,1) (4096,2) (8192,4)")
    for n, h, d in cases:
        for dname in dtypes:
            dt = DTYPES[dname]
            g = torch.Generator(device="cuda").manual_seed(7)
            q, k, v = (torch.randn((n, h, d), generator=g, device="cuda").to(dt) for _ in range(3))
            out = torch.zeros((n, h, d), dtype=dt, device="cuda")
            lse = torch.full((n, h), -math.inf, dtype=torch.float32, device="cuda")
            scale = 1.0 / math.sqrt(d)

            def reset():
                out.zero_()
                lse.fill_(-math.inf)

            for causal in (False, True):
                t_peer = time_ms(lambda: TorchPeer().serialized_attention(q, k, v, ANCHOR, causal, scale))
                for variant in variants:
                    if d not in variant_dims(variant):
                        continue
                    os.environ[SIXTEEN_BIT_ENV] = variant
                    try:
                        t_ours = time_ms(lambda: ours(q, k, v, ANCHOR, causal, scale, out, lse), reset=reset)
                    except Exception as exc:  # noqa: BLE001
                        msg = describe_failure(variant, d, dname, exc)
                        if msg not in failures:
                            failures.append(msg)
                        ok = False
                        print(f"  N={n} H={h:2d} D={d:3d} {dname:8s} causal={int(causal)} peer {t_peer:7.2f} ms | "
                              f"{variant} FAILED", flush=True)
                        continue
                    finally:
                        os.environ.pop(SIXTEEN_BIT_ENV, None)
                    print(f"  N={n} H={h:2d} D={d:3d} {dname:8s} causal={int(causal)} peer {t_peer:7.2f} ms "
                          f"({useful_tflops(n, h, d, ANCHOR, causal, t_peer):5.1f} TFLOP/s) | {variant:7s} "
                          f"{t_ours:7.2f} ms ({useful_tflops(n, h, d, ANCHOR, causal, t_ours):5.1f} TFLOP/s) "
                          f"speedup {t_peer / t_ours:.2f}x", flush=True)
                    if variant == "tma16":
                        os.environ[SIXTEEN_BIT_ENV] = variant
                        t_r = time_ms(lambda: ours_rounded(q, k, v, ANCHOR, causal, scale, out, lse), reset=reset)
                        os.environ.pop(SIXTEEN_BIT_ENV, None)
                        print(f"    {variant} rounded after every launch (no float32 running output): {t_r:7.2f} ms; "
                              f"the float32 running output costs {100 * (t_ours / t_r - 1):+.1f} %", flush=True)
            sweeps = [(variant, cfg) for variant in variants if d in variant_dims(variant)
                      for cfg in configurations(variant, d)[1:]] if sweep and dname == "bfloat16" else []
            for variant, cfg in sweeps:
                os.environ[SIXTEEN_BIT_ENV] = f"{variant}:{','.join(map(str, cfg))}"
                try:
                    t = [time_ms(lambda: ours(q, k, v, ANCHOR, c, scale, out, lse), reps=3, warm=1, reset=reset)
                         for c in (False, True)]
                    print(f"    {dname} D={d} {variant} {cfg}: {t[0]:7.2f} {t[1]:7.2f} ms "
                          f"({useful_tflops(n, h, d, ANCHOR, False, t[0]):.1f} TFLOP/s non-causal)", flush=True)
                except Exception as exc:  # noqa: BLE001
                    print(f"    {cfg}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                finally:
                    os.environ.pop(SIXTEEN_BIT_ENV, None)
            del q, k, v, out, lse
            torch.cuda.empty_cache()
    return ok, failures


def main() -> int:
    quick, sweep = "--quick" in sys.argv, "--sweep" in sys.argv
    variants = ["wgmma16", "tma16"]
    if "--variants" in sys.argv:
        variants = sys.argv[sys.argv.index("--variants") + 1].split(",")
    t0 = time.time()
    props = torch.cuda.get_device_properties(0)
    cc = props.major * 10 + props.minor
    import cupy

    print(f"device {props.name} cc {cc / 10:.1f}, torch {torch.__version__}, CuPy {cupy.__version__}, "
          f"NVRTC {'.'.join(map(str, cupy.cuda.nvrtc.getVersion()))}")
    if cc != 90:
        print("the 16-bit wgmma kernel needs compute capability 9.0 (sm_90a): nothing to probe here")
        return 1
    os.environ.pop(SIXTEEN_BIT_ENV, None)
    for d in registry.HEAD_DIMS:
        v = choose("bfloat16", d).variant
        print(f"  D={d}: {v.name}, {v.threads} threads, {v.block_queries} queries, {v.shared_bytes} bytes shared")
    ok_a, fail_a = True, []
    for variant in variants:
        ok_v, fail_v = accuracy(quick, variant)
        ok_a, fail_a = ok_a and ok_v, fail_a + fail_v
    print(f"accuracy done in {time.time() - t0:.1f} s", flush=True)
    ok_t, fail_t = timing(quick, sweep, variants)
    for msg in dict.fromkeys(fail_a + fail_t):
        print("FAILURE:", msg)
    ok = ok_a and ok_t
    print(f"{'PASS' if ok else 'FAIL'}: error <= {FACTOR:g}x the peer's everywhere: {ok_a}; timing ran: {ok_t}; "
          f"total {time.time() - t0:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001 - print everything, exit 1
        traceback.print_exc()
        sys.exit(1)
