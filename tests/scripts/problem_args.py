"""The command-line arguments of a problem that the hop scripts share (hop_timeline.py, hop_launch.py)."""

from __future__ import annotations

import argparse


def add_problem_arguments(ap: argparse.ArgumentParser) -> None:
    """--backend, --dtype, --tokens, --heads, --head-dim, with the defaults of the issue-37 problem (bf16, N = 2M,
    H = 8, D = 128, backend cuda)."""
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tokens", type=int, default=1 << 21)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
