"""CUDA FP32 backend: the fused RawKernels on CuPy arrays (split-TF32 tensor cores on sm_80+, FP32 FMA from sm_60)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from hilbert_hpc.backends.base import CupyGpuBackend
from hilbert_hpc.core.dilated import empty_accumulators
from hilbert_hpc.core.patterns import Pattern

if TYPE_CHECKING:
    from hilbert_hpc.kernels.selection import KernelChoice


class CudaFp32Backend(CupyGpuBackend):
    """The FP32 fused kernels on CuPy float32 arrays; the ring uses them instead of attend + merge."""

    name = "cuda-fp32"
    dtypes = ("float32",)
    passes = ("forward", "forward+backward")

    def kernel_choice(self, head_dim: int, dtype: str, gpu_here: bool = True,
                      cc: int | None = None) -> KernelChoice | None:
        """The FP32 kernel this GPU runs for ``head_dim`` (:func:`hilbert_hpc.kernels.selection.choose`);
        ValueError for a head_dim the kernels do not take, RuntimeError for a forced variant this GPU cannot
        run. Without the GPU (``gpu_here=False``): the choice of the GPU nodes (of compute
        capability ``cc`` when given; ``planned_choice``)."""
        from hilbert_hpc.kernels.selection import choose, planned_choice

        return choose("float32", head_dim) if gpu_here else planned_choice("float32", head_dim, cc)

    def backward_kernel_choice(self, head_dim: int, dtype: str) -> KernelChoice | None:
        """The backward kernel this GPU runs (:func:`hilbert_hpc.kernels.selection.choose_backward`)."""
        from hilbert_hpc.kernels.selection import choose_backward

        return choose_backward(dtype, head_dim)

    def serialized_backward(self, qs: Any, ks: Any, vs: Any, out: Any, lse: Any, dout: Any,
                            patterns: Sequence[Pattern], causal: bool, scale: float,
                            kernel: KernelChoice | None = None) -> tuple[Any, Any, Any]:
        """float32 gradients of the backward kernels (``kernel``: the case's backward choice), on CuPy arrays
        (:func:`hilbert_hpc.backends.cuda_autograd.fused_backward`)."""
        from hilbert_hpc.backends.cuda_autograd import fused_backward

        return tuple(fused_backward(qs, ks, vs, out, lse, dout, patterns, causal, scale, kernel))  # type: ignore

    def ring_kernels(self, kernel: KernelChoice | None) -> Any:
        """The fused kernels of ``kernel`` (local patterns and packed ring blocks)."""
        from hilbert_hpc.kernels.providers import provider

        return provider(kernel)

    def ring_backward_kernels(self, kernel: KernelChoice | None) -> Any:
        """The backward kernels of ``kernel`` (the case's backward choice) on the shard and on packed ring blocks
        (:class:`hilbert_hpc.kernels.backward.RingBackwardKernels`; float32 gradients)."""
        from hilbert_hpc.kernels.backward import BackwardKernels, RingBackwardKernels

        if kernel is None:
            raise ValueError("the ring backward of the fused kernels needs the case's backward kernel choice")
        return RingBackwardKernels(BackwardKernels(kernel))

    def to_device(self, x: Any, dtype: Any) -> Any:
        """Copy to the current GPU as float32 (the only dtype of this backend)."""
        import cupy

        if np.dtype(dtype) != np.float32:
            raise ValueError("backend 'cuda-fp32' computes in float32; use dtype = \"float32\" or backend 'cupy'")
        return cupy.ascontiguousarray(cupy.asarray(x, dtype=np.float32))

    def serialized_attention(self, qs: Any, ks: Any, vs: Any, patterns: Sequence[Pattern], causal: bool,
                             scale: float, kernel: KernelChoice | None = None) -> Any:
        """Dilated attention of a whole serialized sequence with the fused kernel (``kernel``: the case's choice;
        None: chosen once here for this call)."""
        import cupy

        kernel = kernel or self.kernel_choice(int(qs.shape[2]), "float32")
        out, lse = empty_accumulators(cupy, qs.shape[0], qs.shape[1], vs.shape[-1], qs.dtype)
        self.ring_kernels(kernel).local_patterns(qs, ks, vs, patterns, causal, scale, out, lse)
        return out
