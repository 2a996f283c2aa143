"""Forward and backward of dilated attention on one GPU: hilbert_hpc.nn against the peers, in one process.

Each contender runs as a torch autograd user calls it: ``out = f(q, k, v)`` with inputs that require
gradients, then ``out.backward(dout)``; both phases are timed with CUDA events (median of ``--repeat`` after
``--warmup``). Contenders: ``ours`` (hilbert_hpc.nn.dilated_attention, natural order), ``torch`` (the torch peer:
gather, SDPA with log-sum-exp, FP32 merge; its backward op per pattern with the merged O and L) and ``flash``
(the same with FlashAttention-4) where it can run; ``flash-dense`` is FlashAttention-4 alone on pre-gathered rows
(no gather, no merge, the sum of the backward times: the issue's dense anchors). Useful FLOPs as the results
files count them (``hilbert_hpc.core.patterns.useful_flops``: forward 4 D per attended pair), the backward's 2.5
times the forward's. Peak memory is
also given over the bytes of Q, K, V, O, dO, dQ, dK, dV. Gradient errors
(max |err| / max |ref| of dQ, dK, dV) are measured on an 8,192-row case of the same shape family against the
float64 CPU computation of the same rounded inputs.

    python tests/scripts/backward_probe.py --case bf16-d64 --case bf16-d64-causal
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from hilbert_hpc import nn as hnn
from hilbert_hpc.backends import cuda_autograd, get_backend
from hilbert_hpc.core.patterns import BACKWARD_FLOPS, Pattern
from hilbert_hpc.core.patterns import useful_flops as count_flops

ANCHOR = [(2048, 1), (4096, 2), (8192, 4)]
#: the 16-bit backward's share of float32 accumulators as the package sets it
DEFAULT_SHARE = cuda_autograd.SCRATCH_SHARE
#: more scratch shares of the 16-bit backward to run ours with (--share)
EXTRA_SHARES: list[float] = []
#: name -> (dtype, N, H, D, causal)
CASES = {
    "bf16-d32": (torch.bfloat16, 262144, 16, 32, False),
    "bf16-d32-causal": (torch.bfloat16, 262144, 16, 32, True),
    "bf16-d64": (torch.bfloat16, 262144, 12, 64, False),
    "bf16-d64-causal": (torch.bfloat16, 262144, 12, 64, True),
    "bf16-d128": (torch.bfloat16, 262144, 8, 128, False),
    "bf16-d128-causal": (torch.bfloat16, 262144, 8, 128, True),
    "fp16-d96": (torch.float16, 262144, 8, 96, False),
    "fp32-d64": (torch.float32, 262144, 12, 64, False),
    "fp32-d64-causal": (torch.float32, 262144, 12, 64, True),
    "fp32-d128": (torch.float32, 262144, 8, 128, False),
    "fp32-d128-causal": (torch.float32, 262144, 8, 128, True),
    "fp32-d32": (torch.float32, 262144, 16, 32, False),
    "fp32-d96": (torch.float32, 262144, 8, 96, False),
}


def useful_flops(n: int, heads: int, d: int, patterns, causal: bool) -> float:
    """Forward FLOPs of the useful work of ``patterns`` ((segment, dilation) pairs) as the results files count
    them (``hilbert_hpc.core.patterns.useful_flops``: 4 D per attended pair)."""
    return float(count_flops(n, heads, d, [Pattern(w, r) for w, r in patterns], causal))


def contenders(dtype):
    """(name, f(q, k, v) in natural order, 16-bit backward scratch share) of every contender that runs these
    inputs here: ``ours`` with the default share of the float32 accumulators (chunks of rows), for 16 bits also
    ``ours-whole`` (float32 accumulators of the whole sequence: the speed the chunks cost)."""
    ours = lambda q, k, v, causal: hnn.dilated_attention(q, k, v, patterns=ANCHOR, causal=causal)  # noqa: E731
    found = [("ours", ours, DEFAULT_SHARE)]
    if dtype in (torch.bfloat16, torch.float16):
        found.append(("ours-whole", ours, 0.0))
        found += [(f"ours-{share:g}", ours, share) for share in EXTRA_SHARES]
    pats = [Pattern(w, r) for w, r in ANCHOR]
    for name in ("torch", "flash"):
        try:
            backend = get_backend(name)
        except Exception as exc:          # not installed, not registered, or cannot run here
            print(f"# {name}: not run ({exc})", file=sys.stderr)
            continue
        if str(dtype).removeprefix("torch.") not in backend.dtypes:
            continue
        scale_of = lambda q: q.shape[-1] ** -0.5  # noqa: E731
        found.append((name, lambda q, k, v, causal, b=backend:
                      b.serialized_attention(q, k, v, pats, causal, scale_of(q)), None))
    return found


def timed(fn, warmup: int, repeat: int) -> float:
    """Median milliseconds of ``fn()`` by CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def measure(name: str, f, dtype, n: int, heads: int, d: int, causal: bool, warmup: int, repeat: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn((n, heads, d), generator=gen, device="cuda", dtype=torch.float32).to(dtype)
                     for _ in range(4))
    q, k, v = (x.requires_grad_(True) for x in (q, k, v))
    state = {}

    def forward():
        state["out"] = None              # the previous output is freed first: peak memory is one step's
        state["out"] = f(q, k, v, causal)

    def backward():
        for x in (q, k, v):
            x.grad = None
        state["out"].backward(dout)

    def both():
        forward()
        backward()

    fwd = timed(forward, warmup, repeat)
    forward()
    torch.cuda.synchronize()

    def fresh_backward():      # each backward needs its own graph: the forward runs outside the events
        forward()
        torch.cuda.synchronize()

    bwd_times = []
    for i in range(warmup + repeat):
        fresh_backward()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        backward()
        b.record()
        b.synchronize()
        if i >= warmup:
            bwd_times.append(a.elapsed_time(b))
    bwd = statistics.median(bwd_times)
    total = timed(both, warmup, repeat)
    peak = torch.cuda.max_memory_allocated()
    flops = useful_flops(n, heads, d, ANCHOR, causal)
    return dict(contender=name, fwd_ms=fwd, bwd_ms=bwd, fwd_bwd_ms=total, fwd_tflops=flops / fwd / 1e9,
                bwd_tflops=BACKWARD_FLOPS * flops / bwd / 1e9,
                fwd_bwd_tflops=(1 + BACKWARD_FLOPS) * flops / total / 1e9,
                peak_gib=peak / 2**30, peak_over_tensors=peak / (8 * q.numel() * q.element_size()))


#: rows of the gradient-error case (the float64 reference runs on the CPU)
ERROR_ROWS = 8192


def measure_dense(dtype, n: int, heads: int, d: int, causal: bool, warmup: int, repeat: int) -> dict:
    """FlashAttention-4 alone on the rows each pattern and head offset selects, gathered before the clock
    starts (no gather, no merge: the issue's dense anchors): forward, and backward with its own O and L."""
    from hilbert_hpc.backends.flash_peer import FA4
    from hilbert_hpc.backends.gather_merge import _gather

    gen = torch.Generator(device="cuda").manual_seed(0)
    full = [torch.randn((n, heads, d), generator=gen, device="cuda", dtype=torch.float32).to(dtype)
            for _ in range(4)]
    scale = d ** -0.5
    batches = [[_gather(FA4, x, p, heads, o) for x in full] for p in (Pattern(w, r) for w, r in ANCHOR)
               for o in range(min(p.dilation, heads))]
    del full
    outs = [FA4.forward(q, k, v, causal, scale) for q, k, v, _ in batches]
    fwd = timed(lambda: [FA4.forward(q, k, v, causal, scale) for q, k, v, _ in batches], warmup, repeat)
    bwd = timed(lambda: [FA4.backward(do, q, k, v, o, lse, causal, scale)
                         for (q, k, v, do), (o, lse) in zip(batches, outs)], warmup, repeat)
    flops = useful_flops(n, heads, d, ANCHOR, causal)
    return dict(contender="flash-dense", fwd_ms=fwd, bwd_ms=bwd, fwd_bwd_ms=fwd + bwd,
                fwd_tflops=flops / fwd / 1e9, bwd_tflops=BACKWARD_FLOPS * flops / bwd / 1e9,
                fwd_bwd_tflops=(1 + BACKWARD_FLOPS) * flops / (fwd + bwd) / 1e9)


def error_inputs(dtype, heads: int, d: int, causal: bool) -> tuple[list, list]:
    """The rounded inputs (q, k, v, dout) of the gradient-error case and the float64 CPU gradients of them."""
    gen = torch.Generator().manual_seed(1)
    inputs = [torch.randn((ERROR_ROWS, heads, d), generator=gen, dtype=torch.float32).to(dtype) for _ in range(4)]
    xs = [x.double().requires_grad_(True) for x in inputs[:3]]
    hnn.dilated_attention(*xs, patterns=ANCHOR, causal=causal).backward(inputs[3].double())
    return inputs, [x.grad for x in xs]


def errors(f, inputs: list, want: list, causal: bool) -> dict:
    """max |err| / max |ref| of dQ, dK, dV of contender ``f`` on the error case."""
    xs = [x.cuda().requires_grad_(True) for x in inputs[:3]]
    out = f(*xs, causal)
    out.backward(inputs[3].cuda().to(out.dtype))
    return {f"err_d{n}": float((x.grad.double().cpu() - w).abs().max() / w.abs().max())
            for n, x, w in zip("qkv", xs, want)}


def print_row(row: dict) -> None:
    """One result row as key=value pairs (floats to 4 significant digits)."""
    print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)


def write_rows(path: str | None, rows: list) -> None:
    """The rows as a JSON list, where a path is given."""
    if path:
        with open(path, "w") as fh:
            json.dump(rows, fh, indent=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="cases (default: all)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--only", action="append", help="run only these contenders (default: all)")
    parser.add_argument("--share", type=float, action="append", default=[],
                        help="also run ours with this scratch share of the 16-bit backward (contender ours-SHARE)")
    args = parser.parse_args()
    EXTRA_SHARES.extend(args.share)
    rows = []
    print(f"# {torch.cuda.get_device_name()}, patterns {ANCHOR}")
    for case in args.case or list(CASES):
        dtype, n, heads, d, causal = CASES[case]
        inputs, want = error_inputs(dtype, heads, d, causal)
        for name, f, share in contenders(dtype):
            if args.only and name not in args.only:
                continue
            if share is not None:
                cuda_autograd.SCRATCH_SHARE = share
            torch.cuda.reset_peak_memory_stats()
            try:
                row = dict(case=case, **measure(name, f, dtype, n, heads, d, causal, args.warmup, args.repeat),
                           **errors(f, inputs, want, causal))
            except Exception as exc:       # one contender failing must not hide the others' rows
                print(f"# {case} {name}: failed: {type(exc).__name__}: {exc}", flush=True)
                continue
            rows.append(row)
            print_row(row)
        if dtype in (torch.bfloat16, torch.float16) and any(c[0] == "flash" for c in contenders(dtype)) and \
                (not args.only or "flash-dense" in args.only):
            row = dict(case=case, **measure_dense(dtype, n, heads, d, causal, args.warmup, args.repeat))
            rows.append(row)
            print_row(row)
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
