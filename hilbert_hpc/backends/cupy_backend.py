"""CuPy backend: the array-module algorithm (tiled matmuls, online softmax) on the GPU.

The same code as the NumPy backend, running on CuPy device arrays; it is what
the ring computes with on GPUs until a fused kernel provider takes over.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from hilbert_hpc.backends.base import CupyGpuBackend
from hilbert_hpc.backends.memory import TiledMemory
from hilbert_hpc.core.dilated import local_dilated_attention
from hilbert_hpc.core.patterns import Pattern

if TYPE_CHECKING:
    from hilbert_hpc.kernels.selection import KernelChoice

#: elements of one score tile of the CuPy backend
CUPY_TILE = 1 << 25


class CupyBackend(CupyGpuBackend):
    """The array-module algorithm on CuPy device arrays."""

    name = "cupy"
    dtypes = ("float64", "float32")
    #: score tiles: ``TILE_ARRAYS`` tiles of ``CUPY_TILE`` elements
    memory = TiledMemory(CUPY_TILE)

    def to_device(self, x: Any, dtype: Any) -> Any:
        """Copy a host array to the current GPU as a contiguous array of ``dtype``."""
        import cupy

        return cupy.ascontiguousarray(cupy.asarray(x, dtype=dtype))

    def serialized_attention(self, qs: Any, ks: Any, vs: Any, patterns: Sequence[Pattern], causal: bool,
                             scale: float, kernel: KernelChoice | None = None) -> Any:
        """Dilated attention of serialized device arrays; output in the accumulator dtype."""
        return local_dilated_attention(qs, ks, vs, patterns, causal, scale)
