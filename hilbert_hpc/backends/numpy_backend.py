"""NumPy backend: tiled BLAS matmuls with online softmax (the CPU reference implementation)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from hilbert_hpc.backends.base import Backend
from hilbert_hpc.backends.memory import TiledMemory
from hilbert_hpc.core.backward import local_dilated_backward
from hilbert_hpc.core.dilated import local_dilated_attention
from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.distributed.ring_backward import HostBlockBackward

if TYPE_CHECKING:
    from hilbert_hpc.kernels.selection import KernelChoice

#: elements of one score tile of the NumPy backend (per thread)
NUMPY_TILE = 1 << 18


class NumpyBackend(Backend):
    """The array-module algorithm on NumPy arrays, on the host."""

    name = "numpy"
    dtypes = ("float64", "float32")
    passes = ("forward", "forward+backward")
    #: score tiles: ``TILE_ARRAYS`` tiles per thread, one thread per core
    memory = TiledMemory(NUMPY_TILE, per_core=True)

    def ring_backward_kernels(self, kernel: KernelChoice | None) -> HostBlockBackward:
        """The exact block backward on the host (:class:`~hilbert_hpc.distributed.ring_backward.HostBlockBackward`
        of :func:`hilbert_hpc.core.backward.attend_backward`)."""
        return HostBlockBackward()

    def to_device(self, x: Any, dtype: Any) -> np.ndarray:
        """NumPy arrays stay where they are (converted to ``dtype``)."""
        return np.ascontiguousarray(x, dtype=dtype)

    def to_numpy(self, x: Any) -> np.ndarray:
        """Identity for NumPy arrays."""
        return np.asarray(x)

    def synchronize(self) -> None:
        """Nothing is asynchronous on the CPU."""

    def serialized_attention(self, qs: np.ndarray, ks: np.ndarray, vs: np.ndarray, patterns: Sequence[Pattern],
                             causal: bool, scale: float, kernel: KernelChoice | None = None) -> np.ndarray:
        """Dilated attention of serialized arrays; output in the accumulator dtype (>= float32)."""
        return local_dilated_attention(qs, ks, vs, patterns, causal, scale)

    def serialized_backward(self, qs: np.ndarray, ks: np.ndarray, vs: np.ndarray, out: np.ndarray,
                            lse: np.ndarray, dout: np.ndarray, patterns: Sequence[Pattern], causal: bool,
                            scale: float, kernel: KernelChoice | None = None) -> tuple[np.ndarray, ...]:
        """Exact gradients on the CPU (:func:`hilbert_hpc.core.backward.local_dilated_backward`)."""
        return local_dilated_backward(qs, ks, vs, out, lse, dout, patterns, causal, scale)
