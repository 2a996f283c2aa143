"""Host time of the 16-bit backward a user calls: how long ``out.backward(dout)`` takes to enqueue its work
(the GPU idle before it, so what is left of the wall is GPU time not hidden behind the host) against its wall,
then a cProfile of three backwards (the Python functions the host time goes to).

A 16-bit case of ``backward_probe.py`` (its shapes and the anchor's patterns), the package's scratch share (chunks
of rows), three warm-up steps, then three timed ones.

    python3 tests/scripts/backward_host_time.py [--case bf16-d64-causal] [--no-profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

import torch

from backward_probe import ANCHOR, CASES
from hilbert_hpc import nn as hnn


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="bf16-d64", choices=[c for c, v in CASES.items() if v[0] != torch.float32])
    parser.add_argument("--no-profile", action="store_true", help="only the host and wall times")
    args = parser.parse_args()
    dtype, n, heads, d, causal = CASES[args.case]
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn((n, heads, d), generator=gen, device="cuda").to(dtype) for _ in range(4))
    q, k, v = (x.requires_grad_(True) for x in (q, k, v))

    def step() -> tuple[float, float]:
        out = hnn.dilated_attention(q, k, v, patterns=ANCHOR, causal=causal)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out.backward(dout)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        return (t1 - t0) * 1e3, (time.perf_counter() - t0) * 1e3

    for _ in range(3):
        step()
    for _ in range(3):
        host, wall = step()
        print(f"backward: host enqueue {host:.2f} ms, wall {wall:.2f} ms", flush=True)
    if not args.no_profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(3):
            step()
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(45)
    return 0


if __name__ == "__main__":
    sys.exit(main())
