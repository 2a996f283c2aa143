"""Differentiable dilated attention for torch: ``dilated_attention`` and the ``DilatedAttention`` module.

Importing this module imports torch (``import hilbert_hpc`` does not). The
attention is two ``torch.library`` custom ops, ``hilbert_hpc::dilated_forward``
(serialized inputs -> output and merged log-sum-exp) and
``hilbert_hpc::dilated_backward`` (docs/semantics.md, section 10), joined by
``torch.library.register_autograd`` and given fake (meta) implementations, so
autograd differentiates it and ``torch.compile(fullgraph=True)`` keeps it in one
graph. The orderings are ``index_select`` permutations around the ops: their
gradients flow back through torch. CPU tensors: float64 and float32 compute in
their own dtype; bfloat16, float16 and integer inputs compute in float32, and
16-bit outputs (and so their gradients) are cast back to the input's dtype.
CUDA tensors stay on their GPU (:mod:`hilbert_hpc.backends.cuda_autograd`):
float32, bfloat16 and float16 run the fused forward and backward kernels in
their dtype, float64 the exact blockwise computation; integer inputs compute in
float32.
"""

import operator
from functools import lru_cache
from typing import Sequence

import numpy as np
import torch

from hilbert_hpc.core.arguments import batch_view, check_arguments, problem_arguments
from hilbert_hpc.core.backward import local_dilated_backward
from hilbert_hpc.core.dilated import local_dilated_forward
from hilbert_hpc.core.ordering import inverse_order, problem_order, resolve_ordering
from hilbert_hpc.core.patterns import Pattern, parse_patterns

#: input dtypes computed in float32 and cast back on the CPU (it has no 16-bit attention here)
CAST_BACK = (torch.bfloat16, torch.float16)
#: dtypes a CUDA tensor is computed in as it is (others in float32)
CUDA_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def _patterns(segments: list[int], dilations: list[int]) -> tuple[Pattern, ...]:
    return tuple(Pattern(w, r) for w, r in zip(segments, dilations))


def _host(x: torch.Tensor) -> np.ndarray:
    return x.detach().numpy()


@torch.library.custom_op("hilbert_hpc::dilated_forward", mutates_args=(), device_types="cpu")
def dilated_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: list[int], dilations: list[int],
                    causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Serialized (B, N, H, D) float32/float64 q, k, v -> output (B, N, H, Dv) and merged log-sum-exp (B, N, H)."""
    pats = _patterns(segments, dilations)
    parts = [local_dilated_forward(_host(q[i]), _host(k[i]), _host(v[i]), pats, causal, scale)
             for i in range(q.shape[0])]
    return (torch.from_numpy(np.stack([p[0] for p in parts]).reshape(*q.shape[:3], v.shape[3])),
            torch.from_numpy(np.stack([p[1] for p in parts]).reshape(q.shape[:3])))


@dilated_forward.register_kernel("cuda")
def _dilated_forward_cuda(q, k, v, segments, dilations, causal, scale):
    from hilbert_hpc.backends.cuda_autograd import forward

    pats = _patterns(segments, dilations)
    return _batched(lambda i: forward(q[i], k[i], v[i], pats, causal, scale), q.shape[0])


@dilated_forward.register_fake
def _dilated_forward_fake(q, k, v, segments, dilations, causal, scale):
    return q.new_empty((*q.shape[:3], v.shape[3])), q.new_empty(q.shape[:3])


@torch.library.custom_op("hilbert_hpc::dilated_backward", mutates_args=(), device_types="cpu")
def dilated_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                     dout: torch.Tensor, segments: list[int], dilations: list[int], causal: bool,
                     scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of :func:`dilated_forward`, from its output and log-sum-exp and ``dout``."""
    pats = _patterns(segments, dilations)
    parts = [local_dilated_backward(*(_host(x[i]) for x in (q, k, v, out, lse, dout)), pats, causal, scale)
             for i in range(q.shape[0])]
    return tuple(torch.from_numpy(np.stack([p[j] for p in parts]).reshape(x.shape))
                 for j, x in enumerate((q, k, v)))


@dilated_backward.register_kernel("cuda")
def _dilated_backward_cuda(q, k, v, out, lse, dout, segments, dilations, causal, scale):
    from hilbert_hpc.backends.cuda_autograd import backward

    pats = _patterns(segments, dilations)
    return _batched(lambda i: backward(q[i], k[i], v[i], out[i], lse[i], dout[i], pats, causal, scale), q.shape[0])


def _batched(compute, batch: int) -> tuple[torch.Tensor, ...]:
    """The results of ``compute(i)`` (a tuple of tensors per batch entry) stacked along a new first dimension,
    without a second copy of the whole: one entry is a view of its results; more are copied in one at a time."""
    first = compute(0)
    if batch == 1:
        return tuple(x.unsqueeze(0) for x in first)
    results = tuple(x.new_empty((batch, *x.shape)) for x in first)
    for i in range(batch):
        for dst, src in zip(results, first if i == 0 else compute(i)):
            dst[i].copy_(src)
    return results


@dilated_backward.register_fake
def _dilated_backward_fake(q, k, v, out, lse, dout, segments, dilations, causal, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, segments, dilations, causal, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.geometry = (segments, dilations, causal, scale)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, dlse):
    dq, dk, dv = dilated_backward(*ctx.saved_tensors, dout.contiguous(), *ctx.geometry)
    return dq, dk, dv, None, None, None, None


torch.library.register_autograd("hilbert_hpc::dilated_forward", _backward, setup_context=_setup_context)


def _check_tensors(q, k, v) -> None:
    """q, k, v must be torch tensors on the CPU or on one CUDA device (TypeError / ValueError /
    NotImplementedError naming the argument)."""
    for name, x in zip("qkv", (q, k, v)):
        if not isinstance(x, torch.Tensor):
            kind = type(x)
            raise TypeError(f"{name}: expected a torch tensor, got {kind.__module__.split('.')[0]}.{kind.__name__} "
                            f"(hilbert_hpc.dilated_attention takes NumPy arrays)")
        if x.device.type not in ("cpu", "cuda"):
            raise NotImplementedError(f"{name}: is on {x.device}; hilbert_hpc.nn computes on CPU and CUDA tensors")
        if x.device != q.device:
            raise ValueError(f"{name}: is on {x.device}, q on {q.device}; q, k and v must be on one device")


@torch.compiler.assume_constant_result
def _geometry(tokens: int, heads: int, head_dim: int, batched: bool, patterns: Sequence,
              grid: Sequence[int] | int | None, ordering: str, scale: float | None, segment: int | None
              ) -> tuple[list[int], list[int], float, torch.Tensor | None, torch.Tensor | None]:
    """The checked problem geometry as the ops take it: segments, dilations, scale, and the serialization
    permutation and its inverse as index tensors (None for the natural order). A constant for torch.compile.
    The arguments are checked on every call; the index tensors are made once per (grid, ordering, segment)
    of checked values (:func:`_index_order`), not on every call of a training loop."""
    pats, dims, ordering, block, scale = problem_arguments(tokens, heads, head_dim, batched, patterns, grid,
                                                           ordering, scale, segment)
    order, inverse = _index_order(dims, ordering, block)
    return [p.segment for p in pats], [p.dilation for p in pats], scale, order, inverse


@lru_cache(maxsize=16)
def _index_order(dims: tuple[int, ...], ordering: str, segment: int | None
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The serialization permutation of a checked grid, ordering and segment and its inverse as index tensors
    (None, None for the natural order), kept for the next call."""
    perm = problem_order(dims, ordering, segment)
    if np.array_equal(perm, np.arange(len(perm))):
        return None, None
    return torch.tensor(perm), torch.tensor(inverse_order(perm))


def dilated_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, patterns: Sequence,
                      causal: bool = False, grid: Sequence[int] | int | None = None, ordering: str = "natural",
                      scale: float | None = None, segment: int | None = None) -> torch.Tensor:
    """Dilated attention of torch tensors, differentiable by autograd (docs/semantics.md, sections 1-6 and 10).

    The arguments and their checks are those of :func:`hilbert_hpc.dilated_attention`:
    ``q``, ``k``, ``v`` of one dtype, all of shape (N, H, D) or all (B, N, H, D),
    in natural order, ``patterns`` a list of ``(segment, dilation)``, ``grid``
    the natural order's shape (default ``(N,)``; ``hilbert`` without it warns,
    as the Hilbert curve of ``(N,)`` is the natural order), ``ordering``
    ``natural``, ``hilbert`` or ``hilbert-segment`` (with ``segment``), ``scale``
    default 1/sqrt(D). Returns the output in natural order, the input's leading
    shape, on the input's device: float64 for float64 inputs, the input's dtype
    for bfloat16/float16 (on the CPU computed in float32, on a GPU by the 16-bit
    kernels), float32 otherwise. Gradients reach q, k and v.

    Raises TypeError for arguments that are not torch tensors or not of one
    dtype (and the API misuse :func:`hilbert_hpc.core.arguments.check_arguments`
    refuses), ValueError (``ConfigError``) for shapes and problems and for q, k,
    v on different devices, NotImplementedError for tensors that are neither on
    the CPU nor on a CUDA GPU. The arguments are checked on every call: the
    answer never depends on the calls made before.
    """
    check_arguments(q, k, v, causal, scale)
    _check_tensors(q, k, v)
    batched, (q4, k4, v4) = batch_view(q, k, v)
    # operator.index: under torch.compile, the geometry specializes on the sequence length, heads and head dimension
    tokens, heads, head_dim = (operator.index(q4.shape[i]) for i in (1, 2, 3))
    segments, dilations, scale, order, inverse = _geometry(tokens, heads, head_dim, batched, patterns, grid,
                                                           ordering, scale, segment)
    if order is not None and q.device.type != "cpu":
        order, inverse = order.to(q.device), inverse.to(q.device)
    if q.device.type == "cuda":
        compute = q.dtype if q.dtype in CUDA_DTYPES else torch.float32
    else:
        compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    qs, ks, vs = ((x if order is None else x.index_select(1, order)).to(compute).contiguous() for x in (q4, k4, v4))
    out, _ = dilated_forward(qs, ks, vs, segments, dilations, bool(causal), scale)
    if inverse is not None:
        out = out.index_select(1, inverse)
    if out.dtype != q.dtype and q.dtype in CAST_BACK:
        out = out.to(q.dtype)
    # squeeze, not out[0]: select's backward copies the output gradient into a zeroed (1, N, H, D) tensor (one
    # more tensor of the output's size at the backward's peak); squeeze's is a view of it
    return out if batched else out.squeeze(0)


class DilatedAttention(torch.nn.Module):
    """:func:`dilated_attention` as a module: ``DilatedAttention(patterns=..., ...)(q, k, v)``.

    The patterns and the ordering are checked when the module is built; the rest
    when it is called, as :func:`dilated_attention` does.
    """

    def __init__(self, *, patterns: Sequence, causal: bool = False, grid: Sequence[int] | int | None = None,
                 ordering: str = "natural", scale: float | None = None, segment: int | None = None) -> None:
        super().__init__()
        pats = parse_patterns(patterns)
        resolve_ordering(ordering, pats, segment)
        #: (segment, dilation) pairs: plain tuples, which torch.compile takes as constants
        self.patterns = tuple((p.segment, p.dilation) for p in pats)
        self.causal, self.grid, self.ordering, self.scale, self.segment = causal, grid, ordering, scale, segment

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The dilated attention of ``q``, ``k``, ``v`` with this module's arguments."""
        return dilated_attention(q, k, v, patterns=self.patterns, causal=self.causal, grid=self.grid,
                                 ordering=self.ordering, scale=self.scale, segment=self.segment)

    def extra_repr(self) -> str:
        pats = ", ".join(f"({w},{r})" for w, r in self.patterns)
        return (f"patterns=[{pats}], causal={self.causal}, grid={self.grid}, ordering={self.ordering!r}, "
                f"scale={self.scale}, segment={self.segment}")
