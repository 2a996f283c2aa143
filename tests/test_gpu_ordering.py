"""GPU Hilbert keys and order: bit-identical to the CPU serialization."""

from __future__ import annotations

import numpy as np
import pytest

from hilbert_hpc import serialization_order
from hilbert_hpc.core.hilbert import bits_for, hilbert_encode

from conftest import gpu_available  # noqa: E402

cupy = pytest.importorskip("cupy")
HAVE_GPU = gpu_available()

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAVE_GPU, reason="needs an NVIDIA GPU")]


@pytest.mark.parametrize("grid", [(1000,), (64, 64), (200, 120), (16, 16, 16), (45, 37, 23), (3, 5, 2, 4),
                                  (1024, 1024)])
def test_gpu_order_is_bit_identical(grid):
    from hilbert_hpc.tools.gpu_ordering import gpu_hilbert_keys, gpu_serialization_order

    cpu = serialization_order(grid, "hilbert")
    assert np.array_equal(cupy.asnumpy(gpu_serialization_order(grid)), cpu)
    coords = np.stack(np.unravel_index(np.arange(int(np.prod(grid))), grid), axis=1)
    bits = max(bits_for(g) for g in grid)
    assert np.array_equal(cupy.asnumpy(gpu_hilbert_keys(grid)), hilbert_encode(coords, bits))
