"""CUDA backend ``cuda``: the fused kernels in the case's dtype.

float32 runs the FP32 kernels of backend ``cuda-fp32`` (split-TF32 tensor cores,
FP32 FMA on older GPUs) on CuPy arrays, on one rank or around the ring.
bfloat16 and float16 run the 16-bit tensor-core kernels (``kernels/sixteen_bit.py``:
tma16 or wgmma16 on Hopper, mma16 on compute capability 8.0+; FP32 scores, softmax,
and log-sum-exp; with tma16 a float32 running output for local patterns, rounded to 16
bits once; otherwise the output rounded once per merge). CuPy has no
bfloat16, so 16-bit arrays are torch tensors (made exactly as the PyTorch peer
makes them), and the kernel gets their device pointers. Around the ring the
16-bit tensors travel as CuPy int16 views of their bits (``ring_side``): the
packed K/V blocks carry half the bytes of float32, and the running output stays
16-bit (turned back into a tensor of the case's dtype at the end).
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from hilbert_hpc.backends.base import RingSide, forward_accumulators
from hilbert_hpc.backends.cuda_fp32 import CudaFp32Backend
from hilbert_hpc.backends.memory import BackendMemory, RankShape
from hilbert_hpc.backends.torch_peer import device, to_tensor, torch_dtype
from hilbert_hpc.core.arrays import is_tensor, tensor_to_numpy
from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.core.precision import precision

if TYPE_CHECKING:
    from hilbert_hpc.kernels.selection import KernelChoice


def _bits(x: Any) -> Any:
    """A 16-bit tensor as a CuPy int16 view of its bits (no copy): what the ring packs and moves (any other
    array as it is)."""
    if not is_tensor(x):
        return x
    import cupy
    import torch

    return cupy.asarray(x.view(torch.int16))


def _as_tensor(out: Any, dtype: str) -> Any:
    """The ring's 16-bit running output (int16 bits) as a tensor of ``dtype`` (a view, no copy)."""
    import torch

    return torch.as_tensor(out, device=device()).view(torch_dtype(dtype))


def _rounded(grads: tuple[Any, Any, Any], dtype: str) -> tuple[Any, Any, Any]:
    """The ring backward's float32 sums rounded once (to nearest even) into tensors of ``dtype``."""
    import torch

    return tuple(torch.as_tensor(g, device=device()).to(torch_dtype(dtype)) for g in grads)  # type: ignore


def _sixteen_bit(dtype: Any) -> bool:
    """True for bfloat16 and float16 (a case dtype name or a NumPy dtype): the one test of this backend."""
    return precision(np.dtype(dtype).name if not isinstance(dtype, str) else dtype).sixteen_bit


class FusedMemory(BackendMemory):
    """What backend ``cuda`` holds: its output in the case's dtype, tma16's float32 scratch, and 16-bit gradients
    with float32 sums."""

    def output_itemsize(self, itemsize: int) -> int:
        """The fused kernels keep a 16-bit output 16-bit."""
        return itemsize

    def workspace_bytes(self, shape: RankShape) -> int:
        """tma16's float32 running output of local patterns, one group of heads at a time."""
        return shape.kernel.scratch_bytes(shape.shard, shape.heads) if shape.kernel else 0

    def gradient_bytes(self, shape: RankShape) -> int:
        """16 bits on one device: the gradients in 16 bits and the float32 sums of one chunk of rows
        (:func:`hilbert_hpc.backends.cuda_autograd.chunk_rows`); on several ranks (the ring backward, whatever
        the patterns) the float32 sums of the whole shard and the 16-bit gradients they are rounded into (a
        2-rank bf16 case measured 30.1 GiB where the float32 sums alone gave 26.0); float32: as the default."""
        if shape.itemsize != 2:
            return super().gradient_bytes(shape)
        if shape.ranks > 1:
            return 3 * shape.row * shape.shard * (4 + shape.itemsize)
        from hilbert_hpc.backends.cuda_autograd import SCRATCH_SHARE, chunk_rows

        chunk = chunk_rows(shape.shard, shape.patterns, SCRATCH_SHARE)
        return 3 * shape.row * (shape.shard * shape.itemsize + chunk * 4)


class CudaFused(CudaFp32Backend):
    """What backend ``cuda`` and its two sides share: the name, the memory model, and a synchronization of the
    whole GPU (CuPy launches and torch conversions)."""

    name = "cuda"
    memory = FusedMemory()

    def synchronize(self) -> None:
        """Wait for all work queued on this GPU (CuPy launches and torch conversions)."""
        import cupy

        cupy.cuda.Device().synchronize()


class CudaFp32Side(CudaFused):
    """Backend ``cuda`` in float32: the FP32 kernels of backend ``cuda-fp32`` on CuPy arrays."""

    dtypes = ("float32",)


class CudaSixteenBit(CudaFused):
    """Backend ``cuda`` in bfloat16 and float16: the 16-bit tensor-core kernels on torch tensors."""

    dtypes = ("bfloat16", "float16")

    def kernel_choice(self, head_dim: int, dtype: str, gpu_here: bool = True,
                      cc: int | None = None) -> KernelChoice | None:
        """The 16-bit kernel this GPU runs for ``head_dim`` and ``dtype`` (:func:`hilbert_hpc.kernels.selection.
        choose`; RuntimeError for a GPU without 16-bit tensor cores or a forced variant it cannot run).
        ``gpu_here=False``: the choice of the GPU nodes (of compute capability ``cc`` when given)."""
        from hilbert_hpc.kernels.selection import choose, planned_choice

        return choose(dtype, head_dim) if gpu_here else planned_choice(dtype, head_dim, cc)

    def serialized_backward(self, qs: Any, ks: Any, vs: Any, out: Any, lse: Any, dout: Any,
                            patterns: Sequence[Pattern], causal: bool, scale: float,
                            kernel: KernelChoice | None = None) -> tuple[Any, Any, Any]:
        """The gradients rounded once to the case's dtype from the backward kernel's float32 sums, as
        ``hilbert_hpc.nn`` returns them (:func:`hilbert_hpc.backends.cuda_autograd.backward`)."""
        from hilbert_hpc.backends.cuda_autograd import backward

        return backward(qs, ks, vs, out, lse, dout, patterns, causal, scale, kernel)

    def ring_side(self, dtype: str, kernel: KernelChoice | None = None, backward_kernel: KernelChoice | None = None,
                  backward: bool = False) -> RingSide | None:
        """The 16-bit kernels with the tensors moved as CuPy int16 views of their bits (no copy), the running
        output turned back into a tensor of ``dtype`` (a view) and the float32 gradient sums rounded once (to
        nearest even) into tensors of ``dtype``, as :meth:`serialized_backward` rounds them."""
        side = super().ring_side(dtype, kernel, backward_kernel, backward)
        if side is None:
            return None
        return dataclasses.replace(side, view=_bits, output=partial(_as_tensor, dtype=dtype),
                                   gradients=partial(_rounded, dtype=dtype))

    def to_device(self, x: Any, dtype: Any) -> Any:
        """A torch tensor on this GPU, rounded to nearest even."""
        return to_tensor(x, dtype)

    def to_numpy(self, x: Any) -> np.ndarray:
        """A host copy of a tensor (bfloat16 as float32, exactly) or of one of the ring's CuPy arrays (its float32
        sums, a 16-bit output's bits)."""
        return tensor_to_numpy(x) if is_tensor(x) else super().to_numpy(x)

    def serialized_attention(self, qs: Any, ks: Any, vs: Any, patterns: Sequence[Pattern], causal: bool,
                             scale: float, kernel: KernelChoice | None = None) -> Any:
        """Dilated attention of a whole serialized sequence with the 16-bit kernel (``kernel``: the case's choice;
        None: chosen once here for this call)."""
        n, heads, head_dim = qs.shape
        kernel = kernel or self.kernel_choice(int(head_dim), str(qs.dtype).removeprefix("torch."))
        out, lse = forward_accumulators(qs, vs, patterns)
        self.ring_kernels(kernel).local_patterns(qs, ks, vs, patterns, causal, scale, out, lse)
        return out


#: the side of backend ``cuda`` per precision: FP32, or 16 bits
_SIDES: dict[bool, type[CudaFused]] = {False: CudaFp32Side, True: CudaSixteenBit}


class CudaBackend(CudaFused):
    """The fused kernels in the case's dtype: :class:`CudaFp32Side` for float32, :class:`CudaSixteenBit` (torch
    tensors) for 16 bits. A case takes its side once (:meth:`for_dtype`); the methods here, for callers that hold
    the backend itself, hand each call to the side of its dtype or of its arrays (a torch tensor is 16-bit)."""

    dtypes = ("float32", "bfloat16", "float16")

    def for_dtype(self, dtype: str) -> CudaFused:
        """The side that computes ``dtype``: :class:`CudaSixteenBit` for bfloat16 and float16, else
        :class:`CudaFp32Side`."""
        return _SIDES[_sixteen_bit(dtype)]()

    def _side_of(self, x: Any) -> CudaFused:
        """The side whose arrays ``x`` is (torch tensors are the 16-bit side's)."""
        return _SIDES[is_tensor(x)]()

    def kernel_choice(self, head_dim: int, dtype: str, gpu_here: bool = True,
                      cc: int | None = None) -> KernelChoice | None:
        """The kernel of ``dtype``'s side (:meth:`for_dtype`)."""
        return self.for_dtype(dtype).kernel_choice(head_dim, dtype, gpu_here, cc)

    def ring_side(self, dtype: str, kernel: KernelChoice | None = None, backward_kernel: KernelChoice | None = None,
                  backward: bool = False) -> RingSide | None:
        """The ring side of ``dtype``'s side."""
        return self.for_dtype(dtype).ring_side(dtype, kernel, backward_kernel, backward)

    def to_device(self, x: Any, dtype: Any) -> Any:
        """``x`` as ``dtype``'s side holds it: float32 a contiguous CuPy array, 16 bits a torch tensor."""
        return self.for_dtype(dtype).to_device(x, dtype)

    def to_numpy(self, x: Any) -> np.ndarray:
        """A host copy (bfloat16 as float32, exactly)."""
        return self._side_of(x).to_numpy(x)

    def serialized_attention(self, qs: Any, ks: Any, vs: Any, patterns: Sequence[Pattern], causal: bool,
                             scale: float, kernel: KernelChoice | None = None) -> Any:
        """Dilated attention of a whole serialized sequence on the side of its arrays."""
        return self._side_of(qs).serialized_attention(qs, ks, vs, patterns, causal, scale, kernel)

    def serialized_backward(self, qs: Any, ks: Any, vs: Any, out: Any, lse: Any, dout: Any,
                            patterns: Sequence[Pattern], causal: bool, scale: float,
                            kernel: KernelChoice | None = None) -> tuple[Any, Any, Any]:
        """The gradients on the side of the arrays (:meth:`CudaSixteenBit.serialized_backward`, or the FP32
        kernels' float32 gradients)."""
        return self._side_of(qs).serialized_backward(qs, ks, vs, out, lse, dout, patterns, causal, scale, kernel)
