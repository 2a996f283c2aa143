"""Forward of dilated attention on one GPU: hilbert_hpc.nn against FlashAttention-4 on the same useful work.

For each case, in one process: ``ours`` (``hilbert_hpc.nn.dilated_attention``, natural order, no autograd) and
``flash-dense``, FlashAttention-4's forward alone on the rows each pattern and head offset selects, gathered
before the clock starts (no gather, no merge: the strongest form of the peer, its kernels only). Times are
CUDA-event medians of ``--repeat`` rounds after ``--warmup``, the contenders of a case timed in turns in every
round (a drift of the card's clock reaches them alike); useful FLOPs as the results files count them
(``hilbert_hpc.core.patterns.useful_flops``: 4 D per attended pair). ``ours / flash`` > 1 means ours is faster. Without flash-attn-4 only ``ours`` runs.

    python tests/scripts/forward_probe.py                          # every case (about two minutes on an H200)
    python tests/scripts/forward_probe.py --case d64 --case d64-causal --json fwd.json
    HILBERT_HPC_HALF_KERNEL=tma16:64,4,3,1,0,0,0 python tests/scripts/forward_probe.py --case d64 --only ours
    python tests/scripts/forward_probe.py --case d64 --kernel tma16:64,4,3,1,1,1,1   # also a forced kernel, same run

``--kernel VALUE`` (repeatable) also times ours with ``HILBERT_HPC_HALF_KERNEL=VALUE`` (or the FP32 variable for
the fp32 cases), in the same process as the peer: row keys ``ours[VALUE]_ms``, ``_tflops``, ``_over_flash``
(run with ``--only ours``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from functools import partial
from typing import Callable
from unittest import mock
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from backward_probe import print_row, useful_flops, write_rows  # noqa: E402

from hilbert_hpc import nn as hnn  # noqa: E402
from hilbert_hpc.core.patterns import Pattern  # noqa: E402
from hilbert_hpc.kernels.selection import FP32_ENV, SIXTEEN_BIT_ENV  # noqa: E402

ANCHOR = ((2048, 1), (4096, 2), (8192, 4))


def longnet(n: int) -> tuple:
    """LongNet's patterns of the scaling studies up to the whole sequence: (2048,1) (8192,4) (32768,16) (N,N/2048)."""
    return ((2048, 1), (8192, 4), (32768, 16), (n, n // 2048))


#: name -> (dtype, N, H, D, causal, patterns)
CASES = {
    "d64": (torch.bfloat16, 262144, 12, 64, False, ANCHOR),
    "d64-causal": (torch.bfloat16, 262144, 12, 64, True, ANCHOR),
    "d128": (torch.bfloat16, 262144, 8, 128, False, ANCHOR),
    "d128-causal": (torch.bfloat16, 262144, 8, 128, True, ANCHOR),
    "d96": (torch.bfloat16, 262144, 8, 96, False, ANCHOR),
    "d32": (torch.bfloat16, 262144, 16, 32, False, ANCHOR),
    "longnet-1m": (torch.bfloat16, 1 << 20, 8, 64, False, longnet(1 << 20)),
    "longnet-4m": (torch.bfloat16, 1 << 22, 8, 64, False, longnet(1 << 22)),
    "fp32-d64": (torch.float32, 262144, 12, 64, False, ANCHOR),
    "fp32-d128": (torch.float32, 262144, 8, 128, False, ANCHOR),
    "fp32-d64-causal": (torch.float32, 262144, 12, 64, True, ANCHOR),
    "fp32-d128-causal": (torch.float32, 262144, 8, 128, True, ANCHOR),
    "fp32-d96": (torch.float32, 262144, 8, 96, False, ANCHOR),
    "fp32-d32": (torch.float32, 262144, 16, 32, False, ANCHOR),
}


def inputs(dtype, n: int, heads: int, d: int) -> list:
    gen = torch.Generator(device="cuda").manual_seed(0)
    return [torch.randn((n, heads, d), generator=gen, device="cuda", dtype=torch.float32).to(dtype) for _ in range(3)]


def ours(case: tuple, full: list) -> Callable[[], object]:
    """One forward of hilbert_hpc.nn on the case's inputs."""
    dtype, n, heads, d, causal, patterns = case
    q, k, v = full
    return lambda: hnn.dilated_attention(q, k, v, patterns=list(patterns), causal=causal)


def forced(env: str, value: str, case: tuple, full: list) -> Callable[[], object]:
    """``ours`` with the kernel forced: ``env`` (HILBERT_HPC_HALF_KERNEL or _FP32_KERNEL) set to ``value``
    around each call."""
    run = ours(case, full)

    def call():
        with mock.patch.dict(os.environ, {env: value}):
            return run()
    return call


def flash_dense(case: tuple, full: list) -> Callable[[], object]:
    """FlashAttention-4's forward on the pre-gathered rows of every pattern and head offset."""
    from hilbert_hpc.backends.flash_peer import FA4
    from hilbert_hpc.backends.gather_merge import _gather

    dtype, n, heads, d, causal, patterns = case
    batches = [[_gather(FA4, x, p, heads, o) for x in full] for p in (Pattern(w, r) for w, r in patterns)
               for o in range(min(p.dilation, heads))]
    scale = d ** -0.5
    return lambda: [FA4.forward(q, k, v, causal, scale) for q, k, v in batches]


def interleaved_medians(calls: dict, warmup: int, repeat: int) -> dict:
    """Median milliseconds (CUDA events) of each of ``calls`` (name -> callable), timed in turns: every round
    runs each once, so a drift of the card's clock reaches every contender alike."""
    for fn in calls.values():
        for _ in range(warmup):
            fn()
    times: dict = {name: [] for name in calls}
    for _ in range(repeat):
        for name, fn in calls.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            a.record()
            fn()
            b.record()
            b.synchronize()
            times[name].append(a.elapsed_time(b))
    return {name: statistics.median(t) for name, t in times.items()}


def flash_available() -> str | None:
    """None when FlashAttention-4 can run here, else why not."""
    try:
        from hilbert_hpc.backends import get_backend
        get_backend("flash")
    except Exception as exc:          # not installed, not registered, or cannot run here
        return str(exc)
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="cases (default: all)")
    parser.add_argument("--only", action="append", choices=("ours", "flash-dense"), help="contenders")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--kernel", action="append", default=[],
                        help="also time ours with this forced kernel (HILBERT_HPC_HALF_KERNEL / _FP32_KERNEL value)")
    args = parser.parse_args()
    why_not = flash_available()
    if why_not:
        print(f"# flash-dense: not run ({why_not})", flush=True)
    print(f"# {torch.cuda.get_device_name()}", flush=True)
    rows = []
    for name in args.case or list(CASES):
        case = CASES[name]
        dtype, n, heads, d, causal, patterns = case
        flops = useful_flops(n, heads, d, patterns, causal)
        row = dict(case=name, dtype=str(dtype).removeprefix("torch."), n=n, heads=heads, d=d, causal=causal)
        env = FP32_ENV if dtype == torch.float32 else SIXTEEN_BIT_ENV
        full = inputs(dtype, n, heads, d)
        calls = {}
        with torch.no_grad():
            for who, make in (("ours", ours), ("flash-dense", flash_dense),
                              *((f"ours[{value}]", partial(forced, env, value)) for value in args.kernel)):
                if (args.only and who.split("[")[0] not in args.only) or \
                        (who == "flash-dense" and (why_not or dtype == torch.float32)):
                    continue
                try:
                    calls[who] = make(case, full)
                    calls[who]()               # a contender failing must not hide the others' rows
                except Exception as exc:
                    print(f"# {name} {who}: failed: {type(exc).__name__}: {exc}", flush=True)
                    calls.pop(who, None)
            for who, ms in interleaved_medians(calls, args.warmup, args.repeat).items():
                row[f"{who}_ms"], row[f"{who}_tflops"] = ms, flops / ms / 1e9
        del calls, full
        torch.cuda.empty_cache()
        if "flash-dense_ms" in row:
            for who in [k.removesuffix("_ms") for k in row if k.startswith("ours") and k.endswith("_ms")]:
                row[f"{who}_over_flash"] = row["flash-dense_ms"] / row[f"{who}_ms"]
        rows.append(row)
        print_row(row)
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
