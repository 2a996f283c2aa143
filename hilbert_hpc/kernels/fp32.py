"""The FP32 provider: the registry's FP32 families launched on C-contiguous float32 CuPy arrays.

The kernels all take the same arguments and do the same in-place log-sum-exp merge (``docs/kernels.md``).
:func:`fp32_kernels` gives the provider of one :class:`~hilbert_hpc.kernels.selection.KernelChoice` (the
ring's ``kernels``: local patterns, packed ring blocks, accumulators); each launch runs the choice's variant
for the alignment of its rows (:meth:`KernelChoice.for_alignment`), without deciding anew.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import numpy as np

from hilbert_hpc.kernels.launch import FusedKernels, geometry_arguments, query_chunks
from hilbert_hpc.kernels.program import compiled
from hilbert_hpc.kernels.selection import KernelChoice

Array = Any


def launch(choice: KernelChoice, q: Array, k: Array, v: Array, out: Array, lse: Array, *, qg: tuple, kg: tuple,
           vg: tuple, lg: tuple, segments: int, heads: int, mq: int, mk: int, shift: int | None, scale: float,
           head_dim: int) -> None:
    """One FP32 kernel launch over ``segments x heads`` problems (geometry tuples: base, seg, head, row strides)."""
    if segments == 0 or heads == 0 or mq == 0 or mk == 0:
        return
    if head_dim != choice.head_dim:
        raise ValueError(f"the kernel was chosen for head_dim {choice.head_dim}, got {head_dim}")
    chosen = choice.for_alignment(math.gcd(*qg, *kg, *vg, 16))
    fn = compiled(chosen)
    for qc, lc, mc, sc in query_chunks(qg, lg, mq, shift, chosen.block_queries):
        grid = (segments * heads, -(-mc // chosen.block_queries))
        args = (q, k, v, out, lse, *geometry_arguments(qc, kg, vg, lc, heads, mc, mk, sc, scale))
        fn(grid, (chosen.threads,), args, shared_mem=chosen.shared_bytes)


def check_arrays(*arrays: Array) -> None:
    """The fused FP32 path takes C-contiguous float32 CuPy arrays."""
    for a in arrays:
        if a.dtype != np.float32 or not a.flags.c_contiguous:
            raise ValueError("the fused FP32 kernels need C-contiguous float32 arrays")


def fp32_kernels(choice: KernelChoice) -> FusedKernels:
    """The fused-kernel provider of an FP32 ``choice``: local patterns and ring blocks on float32 arrays."""
    if choice.sixteen_bit:
        raise ValueError(f"the FP32 provider runs float32 choices, not {choice.dtype}")
    return FusedKernels(partial(launch, choice), check_arrays)
