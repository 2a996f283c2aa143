"""CuPy backend: the array-module algorithm (tiled matmuls, online softmax) on the GPU.

The same code as the NumPy backend, running on CuPy device arrays; it is what
the ring computes with on GPUs until a fused kernel provider takes over.
"""

from __future__ import annotations

from typing import Any, Sequence

import cupy
import numpy as np

from hilbert_hpc.core.blockwise import attend
from hilbert_hpc.core.dilated import local_dilated_attention
from hilbert_hpc.core.patterns import Pattern

name = "cupy"
attend_fn = attend
on_gpu = True


def to_device(x: Any, dtype: Any) -> cupy.ndarray:
    """Copy a host array to the current GPU as a contiguous array of ``dtype``."""
    return cupy.ascontiguousarray(cupy.asarray(x, dtype=dtype))


def to_numpy(x: cupy.ndarray) -> np.ndarray:
    """Copy a device array back to host memory."""
    return cupy.asnumpy(x)


def synchronize() -> None:
    """Wait for the current stream."""
    cupy.cuda.get_current_stream().synchronize()


def serialized_attention(qs: cupy.ndarray, ks: cupy.ndarray, vs: cupy.ndarray, patterns: Sequence[Pattern],
                         causal: bool, scale: float) -> cupy.ndarray:
    """Dilated attention of serialized device arrays; output in the accumulator dtype."""
    return local_dilated_attention(qs, ks, vs, patterns, causal, scale)
