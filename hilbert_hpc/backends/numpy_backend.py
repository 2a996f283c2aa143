"""NumPy backend: tiled BLAS matmuls with online softmax (the CPU reference implementation)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from hilbert_hpc.core.blockwise import attend
from hilbert_hpc.core.dilated import local_dilated_attention
from hilbert_hpc.core.patterns import Pattern

name = "numpy"
attend_fn = attend
on_gpu = False


def to_device(x: Any, dtype: Any) -> np.ndarray:
    """NumPy arrays stay where they are (converted to ``dtype``)."""
    return np.ascontiguousarray(x, dtype=dtype)


def to_numpy(x: Any) -> np.ndarray:
    """Identity for NumPy arrays."""
    return np.asarray(x)


def synchronize() -> None:
    """Nothing is asynchronous on the CPU."""


def serialized_attention(qs: np.ndarray, ks: np.ndarray, vs: np.ndarray, patterns: Sequence[Pattern],
                         causal: bool, scale: float) -> np.ndarray:
    """Dilated attention of serialized arrays; output in the accumulator dtype (>= float32)."""
    return local_dilated_attention(qs, ks, vs, patterns, causal, scale)
