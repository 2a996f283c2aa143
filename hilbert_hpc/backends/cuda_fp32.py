"""CUDA FP32 backend: the fused RawKernels on CuPy arrays (split-TF32 tensor cores on sm_80+, FP32 FMA from sm_60)."""

from __future__ import annotations

from typing import Any, Sequence

import cupy
import numpy as np

from hilbert_hpc.kernels.providers import ChoosingKernels
from hilbert_hpc.kernels.selection import choose
from hilbert_hpc.core.blockwise import attend
from hilbert_hpc.core.dilated import empty_accumulators
from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.backends.cupy_backend import synchronize, to_numpy  # noqa: F401  (same array handling as the cupy backend)

name = "cuda-fp32"
attend_fn = attend
on_gpu = True
#: the ring uses these instead of attend + merge
kernels = ChoosingKernels("float32")


def kernel_variant(head_dim: int, dtype: str = "float32") -> str:
    """The FP32 kernel variant this GPU runs for ``head_dim`` (rows aligned to 4 elements), for the results."""
    return choose("float32", head_dim).name


def to_device(x: Any, dtype: Any) -> cupy.ndarray:
    """Copy to the current GPU as float32 (the only dtype of this backend)."""
    if np.dtype(dtype) != np.float32:
        raise ValueError("backend 'cuda-fp32' computes in float32; use dtype = \"float32\" or backend 'cupy'")
    return cupy.ascontiguousarray(cupy.asarray(x, dtype=np.float32))


def serialized_attention(qs: cupy.ndarray, ks: cupy.ndarray, vs: cupy.ndarray, patterns: Sequence[Pattern],
                         causal: bool, scale: float) -> cupy.ndarray:
    """Dilated attention of a whole serialized sequence with the fused kernel."""
    out, lse = empty_accumulators(cupy, qs.shape[0], qs.shape[1], vs.shape[-1], qs.dtype)
    kernels.local_patterns(qs, ks, vs, patterns, causal, scale, out, lse)
    return out
