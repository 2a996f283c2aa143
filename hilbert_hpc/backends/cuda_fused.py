"""CUDA backend ``cuda``: the fused kernels in the case's dtype.

float32 runs the FP32 kernels of backend ``cuda-fp32`` (split-TF32 tensor cores,
FP32 FMA on older GPUs) on CuPy arrays, on one rank or around the ring.
bfloat16 and float16 run the 16-bit Hopper tensor-core kernel
(``kernels/dilated_fwd_wgmma_16.cu``: wgmma with FP32 scores, softmax, running
output and log-sum-exp, the output rounded once per merge). CuPy has no
bfloat16, so 16-bit arrays are torch tensors (made exactly as the PyTorch peer
makes them), and the kernel gets their device pointers. 16-bit cases run on
one rank (the ring moves float32 and float64 blocks).
"""

from __future__ import annotations

from typing import Any, Sequence

import cupy
import numpy as np

from ..arrays import is_tensor, tensor_to_numpy
from ..patterns import Pattern
from ..precision import precision
from . import cuda_fp32

name = "cuda"
on_gpu = True
#: the ring (float32): the same per-block attention and fused kernels as cuda-fp32
attend_fn = cuda_fp32.attend_fn
kernels = cuda_fp32.kernels


def _sixteen_bit(dtype: Any) -> bool:
    return precision(np.dtype(dtype).name if not isinstance(dtype, str) else dtype).sixteen_bit


def check_case(head_dim: int, dtype: str, ranks: int) -> None:
    """Refuse (RuntimeError or ValueError with the reason) what this GPU or backend cannot run: before any work."""
    if not precision(dtype).sixteen_bit:
        from ..kernels import _check_head_dim

        _check_head_dim(head_dim)
        return
    from ..kernels import half

    if ranks > 1:
        raise RuntimeError(f"dtype {dtype} runs on one rank with backend 'cuda' (the ring moves float32 and "
                           f"float64 blocks)")
    half.select_half(head_dim, dtype)


def kernel_variant(head_dim: int, dtype: str = "float32") -> str:
    """The kernel this GPU runs for ``head_dim`` and ``dtype``, for the results file."""
    if precision(dtype).sixteen_bit:
        from ..kernels import half

        return half.select_half(head_dim, dtype).variant
    return cuda_fp32.kernel_variant(head_dim)


def to_device(x: Any, dtype: Any) -> Any:
    """float32: a contiguous CuPy array; 16 bits: a torch tensor on this GPU, rounded to nearest even."""
    if _sixteen_bit(dtype):
        from . import torch_peer

        return torch_peer.to_device(x, dtype)
    return cuda_fp32.to_device(x, dtype)


def to_numpy(x: Any) -> np.ndarray:
    """A host copy (bfloat16 as float32, exactly)."""
    if is_tensor(x):
        return tensor_to_numpy(x)
    return cupy.asnumpy(x)


def synchronize() -> None:
    """Wait for all work queued on this GPU (CuPy launches and torch conversions)."""
    cupy.cuda.Device().synchronize()


def serialized_attention(qs: Any, ks: Any, vs: Any, patterns: Sequence[Pattern], causal: bool,
                         scale: float) -> Any:
    """Dilated attention of a whole serialized sequence with the fused kernel of its dtype."""
    if not is_tensor(qs):
        return cuda_fp32.serialized_attention(qs, ks, vs, patterns, causal, scale)
    import torch

    from ..kernels import half

    n, heads, _ = qs.shape
    out = torch.zeros((n, heads, vs.shape[-1]), dtype=qs.dtype, device=qs.device)
    lse = torch.full((n, heads), float("-inf"), dtype=torch.float32, device=qs.device)
    half.launch_local_patterns(qs, ks, vs, patterns, causal, scale, out, lse)
    return out
