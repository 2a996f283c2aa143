"""CUDA FP32 backend: the fused RawKernels on CuPy arrays (split-TF32 tensor cores on sm_80+, FP32 FMA from sm_60)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from hilbert_hpc.backends.base import CupyGpuBackend, KernelChoice
from hilbert_hpc.core.dilated import empty_accumulators
from hilbert_hpc.core.patterns import Pattern


class CudaFp32Backend(CupyGpuBackend):
    """The FP32 fused kernels on CuPy float32 arrays; the ring uses them instead of attend + merge."""

    name = "cuda-fp32"
    dtypes = ("float32",)

    def kernel_choice(self, head_dim: int, dtype: str, gpu_here: bool = True) -> KernelChoice:
        """The FP32 kernel variant this GPU runs for ``head_dim`` (rows aligned to 4 elements); ValueError for a
        head_dim the kernels do not take, RuntimeError for a forced variant this GPU cannot run. Without the
        GPU (``gpu_here=False``): no kernel is chosen (the FP32 kernels need no memory beyond Q/K/V/O)."""
        if not gpu_here:
            return KernelChoice("unknown")
        from hilbert_hpc import kernels

        return KernelChoice(kernels.select_fp32(head_dim).variant)

    def ring_kernels(self, dtype: str) -> Any:
        """The FP32 fused kernels (local patterns and packed ring blocks)."""
        from hilbert_hpc.kernels import launch

        return launch.FP32

    def to_device(self, x: Any, dtype: Any) -> Any:
        """Copy to the current GPU as float32 (the only dtype of this backend)."""
        import cupy

        if np.dtype(dtype) != np.float32:
            raise ValueError("backend 'cuda-fp32' computes in float32; use dtype = \"float32\" or backend 'cupy'")
        return cupy.ascontiguousarray(cupy.asarray(x, dtype=np.float32))

    def serialized_attention(self, qs: Any, ks: Any, vs: Any, patterns: Sequence[Pattern], causal: bool,
                             scale: float) -> Any:
        """Dilated attention of a whole serialized sequence with the fused kernel."""
        import cupy

        out, lse = empty_accumulators(cupy, qs.shape[0], qs.shape[1], vs.shape[-1], qs.dtype)
        self.ring_kernels("float32").local_patterns(qs, ks, vs, patterns, causal, scale, out, lse)
        return out
