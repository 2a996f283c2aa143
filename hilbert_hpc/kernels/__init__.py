"""Kernel provider: CUDA sources in this folder, compiled once per (source, options, architecture).

The FP32 forward kernel (``dilated_fwd_fp32.cu``) uses only sm_60 features.
CUDA 13 cannot target compute capability < 7.5: on Pascal install the
``cuda12`` extra (``cupy-cuda12x``).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parent
FP32_SOURCE = "dilated_fwd_fp32.cu"
#: head dimensions with an instantiated fast path, and queries per warp for each
QUERIES_PER_WARP = {32: 8, 64: 8, 96: 4, 128: 4}
WARPS = 4
KEY_TILE = 32
#: architectures CI compiles every kernel for (NVRTC 12, no GPU needed)
CHECK_ARCHS = ("compute_61", "compute_70", "compute_80", "compute_90")
OPTIONS = ("-std=c++14",)


def source(name: str = FP32_SOURCE) -> str:
    """Text of a kernel source file."""
    return (KERNEL_DIR / name).read_text()


def kernel_name(head_dim: int) -> str:
    """Template instantiation of the FP32 kernel for ``head_dim``."""
    if head_dim not in QUERIES_PER_WARP:
        raise ValueError(f"the fused FP32 kernel supports head_dim in {sorted(QUERIES_PER_WARP)}, got {head_dim}; "
                         f"use backend 'cupy' for other head dimensions")
    return f"dilated_fwd_fp32<{head_dim},{QUERIES_PER_WARP[head_dim]}>"


def shared_bytes(head_dim: int) -> int:
    """Dynamic shared memory of one block (fits Pascal's 48 KiB for every supported head_dim)."""
    bq = WARPS * QUERIES_PER_WARP[head_dim]
    return 4 * (bq * head_dim + 2 * KEY_TILE * (head_dim + 1) + bq * KEY_TILE)


def check_device() -> tuple[int, int]:
    """(compute capability as int, CUDA runtime version); a clear error where the FP32 path cannot run."""
    import cupy

    cc = int(cupy.cuda.Device().compute_capability)
    runtime = cupy.cuda.runtime.runtimeGetVersion()
    if cc < 60:
        raise RuntimeError(f"compute capability {cc / 10:.1f} is below 6.0 (Pascal), the oldest supported GPU")
    if cc < 75 and runtime >= 13000:
        raise RuntimeError(f"CUDA {runtime // 1000}.{runtime % 1000 // 10} cannot run on compute capability "
                           f"{cc / 10:.1f}: install the cuda12 extra (pip install 'hilbert_hpc[cuda12]', cupy-cuda12x)")
    return cc, runtime


@lru_cache(maxsize=None)
def fp32_kernel(head_dim: int):
    """The compiled FP32 kernel for ``head_dim`` on the current device (cached)."""
    import cupy

    check_device()
    name = kernel_name(head_dim)
    module = cupy.RawModule(code=source(), options=OPTIONS, name_expressions=[name])
    return module.get_function(name)
