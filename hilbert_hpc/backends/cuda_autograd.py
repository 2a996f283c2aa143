"""Forward (output and merged log-sum-exp) and backward of serialized dilated attention on CUDA torch tensors.

The GPU side of :mod:`hilbert_hpc.nn`: everything runs on the tensors' GPU and on torch's current stream
there, and nothing goes to the host. float32, bfloat16 and float16 run the fused kernels (the forward kernel
of :func:`hilbert_hpc.kernels.selection.choose`, the backward kernel of
:func:`hilbert_hpc.kernels.selection.choose_backward`, each chosen once per call); float64, and float32 head
dimensions the fused kernels do not have, run the exact blockwise computation of
:mod:`hilbert_hpc.core.dilated` and :mod:`hilbert_hpc.core.backward` on CuPy views of the tensors.
:func:`fused_backward` is also the backward of the GPU backends' forward+backward cases (CuPy arrays or
tensors).
The backward kernels add their terms to float32 gradients (docs/kernels.md; dK and dV stored by the first
pattern where its keys are every row, not zeroed and added to); 16-bit gradients are rounded from them once, a
chunk of rows at a time (:func:`rounded_backward`: the float32 sums of a chunk of whole
segments, so that they take a tenth of the memory of the tensors, not three quarters).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from hilbert_hpc.backends.base import forward_accumulators
from hilbert_hpc.core.arrays import is_tensor
from hilbert_hpc.core.backward import local_dilated_backward
from hilbert_hpc.core.dilated import local_dilated_forward
from hilbert_hpc.core.patterns import Pattern

if TYPE_CHECKING:
    from hilbert_hpc.kernels.selection import KernelChoice

Tensor = Any


@contextmanager
def tensor_stream(x: Tensor) -> Iterator[None]:
    """CuPy's current device and stream set to ``x``'s GPU and torch's current stream on it (RuntimeError
    naming the package when CuPy is not installed)."""
    import torch

    try:
        import cupy
    except ImportError as exc:
        raise RuntimeError(f"hilbert_hpc.nn computes CUDA tensors with CuPy, which is not importable here ({exc}); "
                           f"install the extra of the CUDA version: pip install 'hilbert-hpc[cuda12]' or '[cuda13]'") from None

    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    stream = torch.cuda.current_stream(index)
    with cupy.cuda.Device(index):
        with cupy.cuda.Stream.from_external(stream) if hasattr(stream, "__cuda_stream__") else \
                cupy.cuda.ExternalStream(stream.cuda_stream, index):
            yield


def fused(dtype: Any, head_dim: int) -> bool:
    """Whether the fused kernels compute this dtype and head dim (else the exact blockwise path does)."""
    import torch

    from hilbert_hpc.kernels.registry import HEAD_DIMS

    if dtype in (torch.bfloat16, torch.float16):
        return True               # the 16-bit kernels refuse other head dims with a message naming them
    return dtype == torch.float32 and head_dim in HEAD_DIMS


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _cupy(*xs: Tensor) -> list[Any]:
    import cupy

    return [cupy.asarray(x.detach()) for x in xs]


def _tensors(xs: Sequence[Any], device: Any) -> tuple[Tensor, ...]:
    import torch

    return tuple(torch.as_tensor(x, device=device) for x in xs)


def forward(qs: Tensor, ks: Tensor, vs: Tensor, patterns: Sequence[Pattern], causal: bool,
            scale: float) -> tuple[Tensor, Tensor]:
    """Output (N, H, Dv) and merged log-sum-exp (N, H) of C-contiguous (N, H, D) CUDA tensors of one dtype.

    The output is in the input's dtype; the log-sum-exp in float32 (float64 for float64 inputs), natural log,
    -inf where no pattern selects the (row, head)."""
    with tensor_stream(qs):
        n, heads, d = (int(x) for x in qs.shape)
        if not fused(qs.dtype, d):
            return _tensors(local_dilated_forward(*_cupy(qs, ks, vs), patterns, causal, scale), qs.device)
        from hilbert_hpc.kernels.providers import provider
        from hilbert_hpc.kernels.selection import choose

        choice = choose(_dtype_name(qs.dtype), d)
        out, lse = forward_accumulators(qs, vs, patterns)
        arrays = (qs, ks, vs) if choice.sixteen_bit else _cupy(qs, ks, vs)
        accumulators = (out, lse) if choice.sixteen_bit else _cupy(out, lse)
        provider(choice).local_patterns(*arrays, patterns, causal, scale, *accumulators)
        return out, lse


def backward(qs: Tensor, ks: Tensor, vs: Tensor, out: Tensor, lse: Tensor, dout: Tensor,
             patterns: Sequence[Pattern], causal: bool, scale: float,
             choice: KernelChoice | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients (dQ, dK, dV) in the inputs' dtype, from the output and log-sum-exp of :func:`forward` and the
    output's gradient ``dout`` (C-contiguous, like the output); ``choice``: the backward kernel (None: chosen
    here, :func:`hilbert_hpc.kernels.selection.choose_backward`)."""
    import torch

    with tensor_stream(qs):
        if not fused(qs.dtype, int(qs.shape[2])):
            grads = local_dilated_backward(*_cupy(qs, ks, vs, out, lse, dout), patterns, causal, scale)
            return _tensors(grads, qs.device)
        if qs.dtype == torch.float32:
            return tuple(fused_backward(qs, ks, vs, out, lse, dout, patterns, causal, scale, choice))
        return rounded_backward(qs, ks, vs, out, lse, dout, patterns, causal, scale, choice)


#: the float32 accumulators of a 16-bit backward, as a share of the bytes of Q, K, V, O, dO, dQ, dK, dV: the
#: rows are taken in chunks of whole segments of every pattern whose float32 dQ, dK, dV fit in it (0: the
#: whole sequence at once)
SCRATCH_SHARE = 0.1


def chunk_rows(n: int, patterns: Sequence[Pattern], share: float) -> int:
    """Rows of one chunk of a 16-bit backward: a multiple of every pattern's segment (so a chunk holds whole
    problems and its gradients need no other rows), the most whose 12 bytes of float32 accumulators per element
    stay within ``share`` of the 16 bytes of the eight 16-bit tensors, at least one such multiple; ``n`` when
    ``share`` is 0 or the whole sequence fits."""
    unit = math.lcm(*(int(p.segment) for p in patterns)) if patterns else n
    if share <= 0:
        return n
    return min(n, max(unit, int(share * 16 / 12 * n) // unit * unit))


def rounded_backward(qs: Tensor, ks: Tensor, vs: Tensor, out: Tensor, lse: Tensor, dout: Tensor,
                     patterns: Sequence[Pattern], causal: bool, scale: float,
                     choice: KernelChoice | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """16-bit gradients of 16-bit tensors: the backward kernel's float32 sums of a chunk of rows
    (:func:`chunk_rows`, :data:`SCRATCH_SHARE`), rounded once into the gradients, chunk after chunk."""
    import torch

    from hilbert_hpc.kernels.backward import BackwardKernels, row_dot
    from hilbert_hpc.kernels.selection import choose_backward

    n = int(qs.shape[0])
    kernels = BackwardKernels(choice or choose_backward(_dtype_name(qs.dtype), int(qs.shape[2])))
    rows = chunk_rows(n, patterns, SCRATCH_SHARE)
    grads = [torch.empty_like(x) for x in (qs, ks, vs)]
    scratch = [torch.empty((rows, *x.shape[1:]), dtype=torch.float32, device=x.device) for x in (qs, ks, vs)]
    delta = row_dot(dout, out)                    # (n, H) float32: one pass for every chunk
    for c0 in range(0, n, rows):
        part = slice(c0, min(n, c0 + rows))
        sums = [x[:part.stop - c0] for x in scratch]
        sums[0].zero_()                           # dq; dk and dv are fresh (stored by the first pattern or zeroed)
        kernels.local_patterns(qs[part], ks[part], vs[part], dout[part], lse[part], delta[part], *sums, patterns,
                               causal, scale, fresh_kv=True)
        for grad, total in zip(grads, sums):
            grad[part].copy_(total)
    return tuple(grads)


def fused_backward(qs: Any, ks: Any, vs: Any, out: Any, lse: Any, dout: Any, patterns: Sequence[Pattern],
                   causal: bool, scale: float, choice: KernelChoice | None = None) -> list[Any]:
    """float32 gradients [dQ, dK, dV] of the backward kernel ``choice`` (None: chosen here) on the current GPU
    and stream: torch tensors or CuPy arrays (the gradients are of the same kind as ``qs``)."""
    from hilbert_hpc.kernels.backward import BackwardKernels, row_dot
    from hilbert_hpc.kernels.selection import choose_backward

    choice = choice or choose_backward(_dtype_name(qs.dtype), int(qs.shape[2]))
    grads = [_float32_array(x, zeros=i == 0) for i, x in enumerate((qs, ks, vs))]
    BackwardKernels(choice).local_patterns(qs, ks, vs, dout, lse, row_dot(dout, out), *grads, patterns, causal,
                                           scale, fresh_kv=True)
    return grads


def _float32_array(x: Any, zeros: bool) -> Any:
    """A float32 array (tensor or CuPy array, as ``x``) of ``x``'s shape on its GPU: zeros, or uninitialized."""
    if is_tensor(x):
        import torch

        return (torch.zeros if zeros else torch.empty)(x.shape, dtype=torch.float32, device=x.device)
    import cupy

    return (cupy.zeros if zeros else cupy.empty)(x.shape, dtype=cupy.float32)
