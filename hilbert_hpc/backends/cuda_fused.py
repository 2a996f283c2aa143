"""CUDA backend ``cuda``: the fused kernels in the case's dtype.

float32 runs the FP32 kernels of backend ``cuda-fp32`` (split-TF32 tensor cores,
FP32 FMA on older GPUs) on CuPy arrays, on one rank or around the ring.
bfloat16 and float16 run the 16-bit tensor-core kernels (``kernels/sixteen_bit.py``:
tma16 or wgmma16 on Hopper, mma16 on compute capability 8.0+; FP32 scores, softmax,
and log-sum-exp; with tma16 a float32 running output for local patterns, rounded to 16
bits once; otherwise the output rounded once per merge). CuPy has no
bfloat16, so 16-bit arrays are torch tensors (made exactly as the PyTorch peer
makes them), and the kernel gets their device pointers. Around the ring the
16-bit tensors travel as CuPy int16 views of their bits (``ring_view``): the
packed K/V blocks carry half the bytes of float32, and the running output stays
16-bit (``ring_output`` turns it back into a tensor of the case's dtype).
"""

from __future__ import annotations

from typing import Any, Sequence

import cupy
import numpy as np

from hilbert_hpc.core.arrays import is_tensor, tensor_to_numpy
from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.core.precision import precision
from hilbert_hpc.backends import cuda_fp32

name = "cuda"
on_gpu = True
#: the ring (float32): the same per-block attention and fused kernels as cuda-fp32
attend_fn = cuda_fp32.attend_fn
kernels = cuda_fp32.kernels


def _sixteen_bit(dtype: Any) -> bool:
    return precision(np.dtype(dtype).name if not isinstance(dtype, str) else dtype).sixteen_bit


def check_case(head_dim: int, dtype: str, ranks: int) -> None:
    """Refuse (RuntimeError or ValueError with the reason) what this GPU or backend cannot run: before any work.

    Every dtype runs on any number of ranks (``ranks`` is part of the backends' common signature)."""
    if not precision(dtype).sixteen_bit:
        from hilbert_hpc.kernels.registry import check_head_dim

        check_head_dim(dtype, head_dim)
        return
    from hilbert_hpc.kernels.selection import choose

    choose(dtype, head_dim)


def kernel_variant(head_dim: int, dtype: str = "float32") -> str:
    """The kernel this GPU runs for ``head_dim`` and ``dtype``, for the results file."""
    if precision(dtype).sixteen_bit:
        from hilbert_hpc.kernels.selection import choose

        return choose(dtype, head_dim).name
    return cuda_fp32.kernel_variant(head_dim)


def to_device(x: Any, dtype: Any) -> Any:
    """float32: a contiguous CuPy array; 16 bits: a torch tensor on this GPU, rounded to nearest even."""
    if _sixteen_bit(dtype):
        from hilbert_hpc.backends import torch_peer

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


def ring_kernels(dtype: str) -> Any:
    """The fused-kernel provider the ring uses for ``dtype`` (16 bits: on int16 views, 16-bit output)."""
    if not precision(dtype).sixteen_bit:
        return kernels
    from hilbert_hpc.kernels.providers import ChoosingKernels

    return ChoosingKernels(dtype)


def ring_view(x: Any) -> Any:
    """The array the ring packs and moves: a 16-bit tensor as a CuPy int16 view of its bits (no copy)."""
    if not is_tensor(x):
        return x
    import torch

    return cupy.asarray(x.view(torch.int16))


def ring_output(out: Any, dtype: str) -> Any:
    """The ring's running output as the case's array: 16 bits as a tensor of ``dtype`` (a view, no copy)."""
    if not precision(dtype).sixteen_bit:
        return out
    import torch

    from hilbert_hpc.backends import torch_peer

    return torch.as_tensor(out, device=torch_peer.device()).view(torch_peer.torch_dtype(dtype))


def serialized_attention(qs: Any, ks: Any, vs: Any, patterns: Sequence[Pattern], causal: bool,
                         scale: float) -> Any:
    """Dilated attention of a whole serialized sequence with the fused kernel of its dtype."""
    if not is_tensor(qs):
        return cuda_fp32.serialized_attention(qs, ks, vs, patterns, causal, scale)
    import torch

    from hilbert_hpc.kernels.sixteen_bit import launch_local_patterns

    n, heads, _ = qs.shape
    out = torch.zeros((n, heads, vs.shape[-1]), dtype=qs.dtype, device=qs.device)
    lse = torch.full((n, heads), float("-inf"), dtype=torch.float32, device=qs.device)
    launch_local_patterns(qs, ks, vs, patterns, causal, scale, out, lse)
    return out
