"""Where a 16-bit backward's GPU time goes: the kernels of ``hilbert_hpc.nn``'s backward on one GPU, by kind.

Runs the forward, then the backward under ``torch.profiler`` (CUDA activity), ``--repeat`` times after a warm-up,
and sums each kernel's device time per backward into groups: the backward kernel itself (``dilated_bwd``),
rowsum(dO * O) (``row_dot``, or the element-wise torch kernels that computed it before), zeroing the float32
accumulators (fill), rounding them into the gradients (copy), and the rest. Prints one line per group with
milliseconds and share, the sum of device time and the backward's wall time by CUDA events, so a change around
the kernel shows in the same run as the kernel. Cases and scratch share as ``backward_probe.py``; ``--host-rowsum`` computes
rowsum(dO * O) with torch's element-wise kernels a chunk of rows at a time (the path of host arrays, which GPU
arrays took before the ``row_dot`` kernel), for a before/after in one run. The backward kernel's configuration
follows ``HILBERT_HPC_BWD_KERNEL``.

    python tests/scripts/backward_breakdown.py --case bf16-d64 --case bf16-d128 [--share 0] [--host-rowsum]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from backward_probe import ANCHOR, CASES, useful_flops
from hilbert_hpc.core.patterns import BACKWARD_FLOPS
from hilbert_hpc import nn as hnn
from hilbert_hpc.backends import cuda_autograd
from hilbert_hpc.kernels import backward as backward_kernels

#: kernel name fragment -> group, first match wins
GROUPS = (("dilated_bwd", "backward kernel"), ("row_dot", "rowsum(dO*O)"), ("reduce", "rowsum(dO*O)"),
          ("mul", "rowsum(dO*O)"), ("fill", "zero accumulators"), ("copy", "round gradients"),
          ("direct_copy", "round gradients"))


def group_of(name: str) -> str:
    """The group a kernel's name falls in (``GROUPS``), ``other`` otherwise."""
    low = name.lower()
    return next((g for frag, g in GROUPS if frag in low), "other")


def breakdown(case: str, share: float, repeat: int) -> None:
    dtype, n, heads, d, causal = CASES[case]
    cuda_autograd.SCRATCH_SHARE = share
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn((n, heads, d), generator=gen, device="cuda").to(dtype) for _ in range(4))
    q, k, v = (x.requires_grad_(True) for x in (q, k, v))

    def one_backward() -> float:
        out = hnn.dilated_attention(q, k, v, patterns=ANCHOR, causal=causal)
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        out.backward(dout)
        b.record()
        b.synchronize()
        for x in (q, k, v):
            x.grad = None
        return a.elapsed_time(b)

    one_backward()
    walls = []
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeat):
            walls.append(one_backward())
    groups: dict[str, float] = collections.defaultdict(float)
    kernels: dict[str, float] = collections.defaultdict(float)
    forward_names = ("dilated_fwd", "widen_16", "narrow_16")
    for e in prof.events():
        if e.device_type.name != "CUDA" or any(f in e.name for f in forward_names):
            continue
        us = e.device_time
        if us <= 0:
            continue
        groups[group_of(e.name)] += us / 1e3 / repeat
        kernels[e.name[:70]] += us / 1e3 / repeat
    timeline = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                      if e.device_type.name == "CUDA" and e.device_time > 0
                      and not any(f in e.name for f in forward_names))
    total = sum(groups.values())
    wall = statistics.median(walls)
    flops = BACKWARD_FLOPS * useful_flops(n, heads, d, ANCHOR, causal)
    print(f"== {case} share={share} {os.environ.get('HILBERT_HPC_BWD_KERNEL', '')}: backward {wall:.2f} ms wall ({flops / wall / 1e9:.0f} useful TFLOP/s), "
          f"{total:.2f} ms of kernels")
    for g, ms in sorted(groups.items(), key=lambda x: -x[1]):
        print(f"  {g:20s} {ms:8.3f} ms {100 * ms / wall:5.1f} %")
    for name, ms in sorted(kernels.items(), key=lambda x: -x[1])[:8]:
        print(f"    {ms:8.3f} ms  {name}")
    print_gaps(timeline, repeat)


def print_gaps(timeline: list, repeat: int) -> None:
    """The GPU's idle time between consecutive backward kernels (a kernel that starts before the one before it
    ended, a dependent launch, counts its overlap as negative), summed per pair of kernel groups."""
    pairs: dict[str, list[float]] = collections.defaultdict(list)
    for (_, end, before), (start, _, after) in zip(timeline, timeline[1:]):
        gap = (start - end) / 1e3
        if gap < 5.0:                      # ms: between backwards (the forward in between) not counted
            pairs[f"{group_of(before)} -> {group_of(after)}"].append(gap)
    for pair, gaps in sorted(pairs.items(), key=lambda x: -sum(x[1])):
        print(f"  gap {pair:45s} {sum(gaps) / repeat:8.3f} ms a backward, {len(gaps) // repeat} a backward, "
              f"median {1e3 * statistics.median(gaps):7.1f} us")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="cases (default: bf16-d64)")
    parser.add_argument("--share", type=float, action="append",
                        help=f"scratch shares (default: the package's, {cuda_autograd.SCRATCH_SHARE})")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--host-rowsum", action="store_true", help="rowsum(dO * O) by torch's element-wise kernels")
    args = parser.parse_args()
    if args.host_rowsum:
        backward_kernels.on_gpu = lambda x: False
    for case in args.case or ["bf16-d64"]:
        for share in args.share or [cuda_autograd.SCRATCH_SHARE]:
            breakdown(case, share, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
