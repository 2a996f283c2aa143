"""Host time of the 16-bit backward a user calls: how long ``out.backward(dout)`` takes to enqueue its work
(the GPU idle before it, so what is left of the wall is GPU time not hidden behind the host) against its wall,
then a cProfile of three backwards (the Python functions the host time goes to).

bf16, N = 262,144, H = 12, D = 64, patterns (2048,1) (4096,2) (8192,4), the package's scratch share (chunks of
rows), three warm-up steps, then three timed ones.

    python3 tests/scripts/backward_host_time.py [--causal] [--no-profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from hilbert_hpc import nn as hnn  # noqa: E402

ANCHOR = [(2048, 1), (4096, 2), (8192, 4)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--no-profile", action="store_true", help="only the host and wall times")
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn((262144, 12, 64), generator=gen, device="cuda").to(torch.bfloat16)
                     for _ in range(4))
    q, k, v = (x.requires_grad_(True) for x in (q, k, v))

    def step() -> tuple[float, float]:
        out = hnn.dilated_attention(q, k, v, patterns=ANCHOR, causal=args.causal)
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
