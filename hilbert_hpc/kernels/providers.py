"""The provider of a kernel choice.

A provider runs local patterns and packed ring blocks with fused kernels and makes the ring's running
output and log-sum-exp (``accumulators``): :func:`provider` gives the FP32 or the 16-bit one of a
:class:`~hilbert_hpc.kernels.selection.KernelChoice` made once per case (callers without a case, such as the
Python API, get the choice from their backend's ``kernel_choice`` once per call).
"""

from __future__ import annotations

from typing import Any

from hilbert_hpc.kernels.fp32 import fp32_kernels
from hilbert_hpc.kernels.selection import KernelChoice
from hilbert_hpc.kernels.sixteen_bit import sixteen_bit_kernels


def provider(choice: KernelChoice) -> Any:
    """The fused-kernel provider of ``choice``: the 16-bit one for bfloat16/float16, else the FP32 one."""
    return sixteen_bit_kernels(choice) if choice.sixteen_bit else fp32_kernels(choice)
