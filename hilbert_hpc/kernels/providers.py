"""The provider of a kernel choice, and the providers for callers that have no choice yet.

A provider runs local patterns and packed ring blocks with fused kernels and makes the ring's running
output and log-sum-exp (``accumulators``): :func:`provider` gives the FP32 or the 16-bit one of a
:class:`~hilbert_hpc.kernels.selection.KernelChoice` made once per case. :class:`ChoosingKernels` serves the
callers that have none (the Python API through the backends): each of its calls makes the choice once, for
the head dim of its arrays, and hands the whole call to that choice's provider.
"""

from __future__ import annotations

from typing import Any, Sequence

from hilbert_hpc.kernels import launch
from hilbert_hpc.kernels.fp32 import fp32_kernels
from hilbert_hpc.kernels.registry import dtype_name
from hilbert_hpc.kernels.selection import KernelChoice, choose
from hilbert_hpc.kernels.sixteen_bit import OUT_DTYPE, sixteen_bit_kernels

Array = Any


def provider(choice: KernelChoice) -> Any:
    """The fused-kernel provider of ``choice``: the 16-bit one for bfloat16/float16, else the FP32 one."""
    return sixteen_bit_kernels(choice) if choice.sixteen_bit else fp32_kernels(choice)


class ChoosingKernels:
    """The provider of ``dtype`` for callers without a choice: every call chooses once (at its top, never per
    launch) for the head dim of its arrays, then runs that choice's provider."""

    def __init__(self, dtype: Any) -> None:
        self.dtype = dtype_name(dtype)

    def accumulators(self, xp: Any, n: int, heads: int, dv: int, dtype: Any) -> tuple[Array, Array]:
        """Running output zeros (n, H, Dv) and log-sum-exp -inf (n, H) of this dtype's kernels."""
        return launch.accumulators(xp, n, heads, dv, dtype, None if self.dtype == "float32" else OUT_DTYPE)

    def local_patterns(self, qs: Array, ks: Array, vs: Array, patterns: Sequence[Any], causal: bool, scale: float,
                       out: Array, lse: Array, shape: Sequence[int] | None = None) -> None:
        """Patterns whose segments lie inside these (n, H, D) arrays, merged into ``out``/``lse``."""
        d = int((qs.shape if shape is None else shape)[2])
        provider(choose(self.dtype, d)).local_patterns(qs, ks, vs, patterns, causal, scale, out, lse, shape=shape)

    def ring_block(self, qs: Array, block: Array, geom: Any, pos: int, src: int, shift: int | None, scale: float,
                   out: Array, lse: Array) -> None:
        """Attend this rank's selected queries to a packed ring block from ``src``; merge in place."""
        provider(choose(self.dtype, int(qs.shape[2]))).ring_block(qs, block, geom, pos, src, shift, scale, out, lse)
