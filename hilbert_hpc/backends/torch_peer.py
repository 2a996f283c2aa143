"""PyTorch peer baseline: what a PyTorch user writes for the same computation.

Gather the dilated rows of each pattern and head offset, run
``scaled_dot_product_attention``'s fastest kernel that also returns the
log-sum-exp (cuDNN, else flash, for 16 bits; memory-efficient for float32 and
float64), and merge patterns by log-sum-exp in at least FP32. Same semantics as every other
backend; it is the baseline every benchmark compares against. Gradients: the same kernel's SDPA
backward op per pattern and head offset, given the merged output and log-sum-exp (ring-flash-attention
style), in an autograd Function.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from hilbert_hpc.backends.base import Backend
from hilbert_hpc.core.patterns import Pattern

if TYPE_CHECKING:
    from hilbert_hpc.kernels.selection import KernelChoice

#: PyTorch peer: gathered Q/K/V/O copies per pattern and offset, measured (docs/performance.md)
TORCH_WORKSPACE = 1.25


def torch_dtype(name: str) -> Any:
    """The torch dtype of a case dtype name ('float32', 'bfloat16', ...)."""
    import torch

    return {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
            "bfloat16": torch.bfloat16}[name]


def device() -> Any:
    """The GPU this rank uses if CUDA is available, else the CPU."""
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def to_tensor(x: Any, dtype: Any) -> Any:
    """A NumPy array, a CUDA array (CuPy) or a tensor as a contiguous tensor of ``dtype`` on ``device()``."""
    import torch

    if isinstance(x, torch.Tensor):
        t = x
    elif hasattr(x, "__cuda_array_interface__"):
        t = torch.as_tensor(x, device=device())
    elif np.dtype(x.dtype).name == "bfloat16":               # ml_dtypes.bfloat16: torch takes its bits
        t = torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(np.ascontiguousarray(x))
    # float32 -> 16 bits rounds to nearest even, as ml_dtypes does for the float64 reference
    return t.to(device=device(), dtype=torch_dtype(np.dtype(dtype).name)).contiguous()


#: SDPA kernels that also return the log-sum-exp, fastest first, per element size on CUDA: cuDNN then flash
#: for 16 bits (measured on an H200: cuDNN 15.0 ms, flash 18.3 ms, memory-efficient 30.4 ms on the bf16 anchor,
#: docs/performance.md); float32 and float64 have only the memory-efficient kernel
CUDA_SDPA_ORDER = {2: ("cudnn", "flash", "efficient"), 4: ("efficient",), 8: ("efficient",)}
#: (dtype, head dim, causal) -> the first kernel of the order that ran for it on CUDA in this process
_sdpa_chosen: dict[tuple, str] = {}
#: the memory-efficient kernel's log-sum-exp has its rows padded to a multiple of this
EFFICIENT_LSE_ROWS = 32


def _sdpa(kind: str, q: Any, k: Any, v: Any, causal: bool, scale: float) -> tuple[Any, Any]:
    """One SDPA kernel on (B, H, L, D) tensors: (output, log-sum-exp (B, H, L) in float32)."""
    import torch

    aten = torch.ops.aten
    if kind == "cudnn":
        out, lse, *_ = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False, scale=scale)
    elif kind == "flash":
        out, lse, *_ = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
    elif kind == "efficient":
        out, lse, *_ = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal, scale=scale)
    else:
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=None,
                                                                     scale=scale)
    lse = lse.reshape(*lse.shape[:2], -1)[..., : q.shape[-2]]      # cuDNN: (B, H, L, 1); efficient: L padded
    return out, lse


def _sdpa_backward(kind: str, dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, causal: bool,
                   scale: float) -> tuple[Any, Any, Any]:
    """The backward op of the SDPA kernel ``kind`` on (B, H, L, D) tensors, given the output ``out`` and the
    log-sum-exp ``lse`` (B, H, L) it is to use: (dQ, dK, dV) in the input dtype.

    With ``out`` and ``lse`` the merged ones, each op computes Delta = rowsum(dO * out) and P = exp(S - lse):
    the backward of the merged softmax restricted to these rows (docs/semantics.md, section 10).
    """
    import torch

    aten = torch.ops.aten
    length = q.shape[-2]
    if kind == "cpu":                   # the log-sum-exp in the op's accumulation type (float64 for float64)
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout, q, k, v, out, lse.to(torch.promote_types(q.dtype, torch.float32)), 0.0, causal,
            attn_mask=None, scale=scale)
    lse = lse.to(torch.float32)
    if kind == "cudnn":
        return aten._scaled_dot_product_cudnn_attention_backward(
            dout, q, k, v, out, lse.unsqueeze(-1).contiguous(), None, None, None, None, None, length, length,
            0.0, causal, scale=scale)
    if kind == "flash":
        return aten._scaled_dot_product_flash_attention_backward(
            dout, q, k, v, out, lse.contiguous(), None, None, length, length, 0.0, causal, None, None,
            scale=scale)
    out = out.transpose(1, 2).contiguous().transpose(1, 2)   # its 16-bit kernel reads the output as (B, L, H, D)
    padded = -(-length // EFFICIENT_LSE_ROWS) * EFFICIENT_LSE_ROWS       # as the forward allocates it
    lse_padded = torch.full((*lse.shape[:2], padded), float("inf"), dtype=torch.float32, device=lse.device)
    lse_padded[..., :length] = lse
    dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
        dout, q, k, v, None, out, lse_padded, None, None, 0.0, [True, True, True, False], causal, scale=scale)
    return dq, dk, dv


def sdpa_kernel(dtype: Any, head_dim: int, causal: bool) -> str | None:
    """The SDPA kernel the peer runs for these CUDA tensors in this process ('cudnn', 'flash', 'efficient'),
    or None before its first call."""
    return _sdpa_chosen.get((dtype, head_dim, causal))


def sdpa_with_lse(q: Any, k: Any, v: Any, causal: bool, scale: float) -> tuple[Any, Any]:
    """``scaled_dot_product_attention`` on (B, H, L, D) tensors, also returning the log-sum-exp (B, H, L): the
    fastest kernel of ``CUDA_SDPA_ORDER`` that takes them (chosen at the first call for their dtype, head dim
    and causality, then kept), the flash kernel for CPU tensors."""
    if not q.is_cuda:
        return _sdpa("cpu", q, k, v, causal, scale)
    key = (q.dtype, q.shape[-1], causal)
    chosen = _sdpa_chosen.get(key)
    if chosen is not None:
        return _sdpa(chosen, q, k, v, causal, scale)
    import torch

    kinds = CUDA_SDPA_ORDER[q.element_size()]
    for i, kind in enumerate(kinds):
        try:
            result = _sdpa(kind, q, k, v, causal, scale)
        except torch.OutOfMemoryError:
            raise
        except RuntimeError:          # this kernel does not take these tensors (dtype, head dim, GPU): the next
            if i == len(kinds) - 1:
                raise
            continue
        _sdpa_chosen[key] = kind
        return result
    raise AssertionError("unreachable")  # pragma: no cover


def _rows(x: Any, p: Pattern, heads: int, o: int) -> Any:
    """The rows of serialized ``x`` (N, H, ...) that pattern ``p`` selects for the heads of offset ``o``, as a
    view (segments, selected rows, heads with offset o, ...)."""
    return x.view(x.shape[0] // p.segment, p.selected, p.dilation, heads, *x.shape[2:])[:, :, o, o::p.dilation]


def _gather(x: Any, p: Pattern, heads: int, o: int) -> Any:
    """:func:`_rows` of an (N, H, D) tensor as a contiguous (segments, heads, selected rows, D) SDPA batch."""
    return _rows(x, p, heads, o).permute(0, 2, 1, 3).contiguous()


def merged_attention(qs: Any, ks: Any, vs: Any, patterns: Sequence[Pattern], causal: bool,
                     scale: float) -> tuple[Any, Any]:
    """SDPA per pattern and head offset merged by log-sum-exp: (output (N, H, Dv), log-sum-exp (N, H)), both
    in at least FP32 (float64 for float64 inputs); rows no pattern selects have output 0 and -inf."""
    import torch

    n, heads, _ = qs.shape
    acc = torch.promote_types(qs.dtype, torch.float32)
    out = torch.zeros((n, heads, vs.shape[-1]), dtype=acc, device=qs.device)
    lse = torch.full((n, heads), float("-inf"), dtype=acc, device=qs.device)
    for p in patterns:
        for o in range(min(p.dilation, heads)):
            part, part_lse = sdpa_with_lse(_gather(qs, p, heads, o), _gather(ks, p, heads, o),
                                           _gather(vs, p, heads, o), causal, scale)
            dst, dst_lse = _rows(out, p, heads, o), _rows(lse, p, heads, o)
            part = part.permute(0, 2, 1, 3).to(acc)
            part_lse = part_lse.permute(0, 2, 1).to(acc)
            new_lse = torch.logaddexp(dst_lse, part_lse)
            dst.copy_(dst * torch.exp(dst_lse - new_lse)[..., None]
                      + part * torch.exp(part_lse - new_lse)[..., None])
            dst_lse.copy_(new_lse)
    return out, lse


def merged_attention_backward(kind: str, dout: Any, qs: Any, ks: Any, vs: Any, out: Any, lse: Any,
                              patterns: Sequence[Pattern], causal: bool, scale: float) -> tuple[Any, Any, Any]:
    """(dQ, dK, dV) of :func:`merged_attention` in the input dtype, from the merged output ``out`` (in the input
    dtype) and log-sum-exp ``lse``: per pattern and head offset, the backward op of the SDPA kernel ``kind`` the
    forward ran, on the gathered rows with ``out`` and ``lse`` restricted to them, scatter-added in at least
    FP32 (16-bit gradients are rounded once, at the end)."""
    import torch

    heads = qs.shape[1]
    acc = torch.promote_types(qs.dtype, torch.float32)
    dout = dout.to(qs.dtype).contiguous()
    grads = [torch.zeros(x.shape, dtype=acc, device=x.device) for x in (qs, ks, vs)]
    for p in patterns:
        for o in range(min(p.dilation, heads)):
            parts = _sdpa_backward(kind, _gather(dout, p, heads, o), _gather(qs, p, heads, o),
                                   _gather(ks, p, heads, o), _gather(vs, p, heads, o), _gather(out, p, heads, o),
                                   _rows(lse, p, heads, o).permute(0, 2, 1), causal, scale)
            for grad, part in zip(grads, parts):
                _rows(grad, p, heads, o).add_(part.permute(0, 2, 1, 3))
    return tuple(g if g.dtype == qs.dtype else g.to(qs.dtype) for g in grads)  # type: ignore[return-value]


@lru_cache(maxsize=None)
def peer_function() -> Any:
    """The peer's ``torch.autograd.Function`` (made on first use: torch is imported only when the peer runs).

    Forward: :func:`merged_attention`, keeping the inputs, the output (in the input dtype, as every SDPA
    backward op takes it) and the merged log-sum-exp, never a per-pattern copy; backward:
    :func:`merged_attention_backward` with the kernel the forward ran.
    """
    import torch

    class PeerAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, qs: Any, ks: Any, vs: Any, patterns: tuple[Pattern, ...], causal: bool,
                    scale: float) -> Any:
            out, lse = merged_attention(qs, ks, vs, patterns, causal, scale)
            out = out if out.dtype == qs.dtype else out.to(qs.dtype)
            ctx.save_for_backward(qs, ks, vs, out, lse)
            ctx.kind = sdpa_kernel(qs.dtype, qs.shape[-1], causal) if qs.is_cuda else "cpu"
            ctx.patterns, ctx.causal, ctx.scale = patterns, causal, scale
            return out

        @staticmethod
        def backward(ctx: Any, dout: Any) -> tuple[Any, ...]:
            grads = merged_attention_backward(ctx.kind, dout, *ctx.saved_tensors, ctx.patterns, ctx.causal,
                                              ctx.scale)
            return (*grads, None, None, None)

    return PeerAttention


class TorchPeer(Backend):
    """The PyTorch peer: SDPA per pattern and head offset, merged by log-sum-exp; one process only."""

    name = "torch"
    dtypes = ("float64", "float32", "bfloat16", "float16")
    requires = ("torch",)
    #: the peer runs on one process: it is the single-device baseline
    attend_fn = None

    @property
    def on_gpu(self) -> bool:  # type: ignore[override]
        """True when torch sees a CUDA device (the peer follows the machine)."""
        import torch

        return torch.cuda.is_available()

    def workspace_bytes(self, shard: int, heads: int, head_dim: int, itemsize: int, qkvo_bytes: int,
                        kernel: KernelChoice | None) -> int:
        """The gathered copies: ``TORCH_WORKSPACE`` times the Q/K/V/O bytes (measured)."""
        return int(TORCH_WORKSPACE * qkvo_bytes)

    def plan_on_gpu(self, gpu_nodes: bool | None) -> bool:
        """On GPU nodes (``gpu_nodes``) the peer runs on their GPU; otherwise as on this machine."""
        return self.require().on_gpu if gpu_nodes is None else gpu_nodes

    def to_device(self, x: Any, dtype: Any) -> Any:
        """A contiguous tensor of ``dtype`` on ``device()`` (:func:`to_tensor`)."""
        return to_tensor(x, dtype)

    def to_numpy(self, x: Any) -> np.ndarray:
        """Copy a tensor back to host memory as a NumPy array (bfloat16 as float32, exactly)."""
        from hilbert_hpc.core.arrays import tensor_to_numpy

        return tensor_to_numpy(x)

    def synchronize(self) -> None:
        """Wait for queued CUDA work (no-op on the CPU)."""
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def serialized_attention(self, qs: Any, ks: Any, vs: Any, patterns: Sequence[Pattern], causal: bool,
                             scale: float, kernel: KernelChoice | None = None) -> Any:
        """Dilated attention of serialized (N, H, D) tensors -> serialized output (N, H, Dv).

        SDPA runs in the input dtype; the merge of patterns, the running output and the log-sum-exp are at
        least FP32; the output has the input dtype. Differentiable: when an input requires a gradient (and
        grad mode is on), the forward keeps the output and the merged log-sum-exp and the backward runs the
        SDPA backward op of the same kernel per pattern and head offset with them (plain autograd through the
        merge would be wrong: SDPA's backward drops its log-sum-exp's gradient); otherwise nothing is kept.
        """
        import torch

        if torch.is_grad_enabled() and any(x.requires_grad for x in (qs, ks, vs)):
            return peer_function().apply(qs, ks, vs, tuple(patterns), causal, scale)
        out, _ = merged_attention(qs, ks, vs, patterns, causal, scale)
        return out if out.dtype == qs.dtype else out.to(qs.dtype)      # 16-bit inputs: a 16-bit output
