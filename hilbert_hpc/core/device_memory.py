"""Peak device memory of this process: CuPy's memory pool and PyTorch's caching allocator.

Both allocators keep freed blocks for reuse, so the bytes they hold after a
computation (having released the cache before it) are the most device memory
the computation needed at once, as the GPU saw it. Only libraries already
imported are asked; on the CPU both figures are 0.
"""

from __future__ import annotations

import sys


def _cupy_pool():
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return None
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            return None
    except Exception:  # noqa: BLE001 - no driver or no device: nothing to measure
        return None
    return cupy.get_default_memory_pool()


def _torch_cuda():
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda


def reset_peak() -> None:
    """Release cached blocks not in use and restart the peak counters."""
    pool = _cupy_pool()
    if pool is not None:
        pool.free_all_blocks()
    tc = _torch_cuda()
    if tc is not None:
        tc.synchronize()
        tc.empty_cache()
        tc.reset_peak_memory_stats()


def peak_bytes() -> int:
    """Device bytes held by CuPy's pool plus the peak PyTorch reserved since ``reset_peak``."""
    total = 0
    pool = _cupy_pool()
    if pool is not None:
        total += int(pool.total_bytes())
    tc = _torch_cuda()
    if tc is not None:
        total += int(tc.max_memory_reserved())
    return total
