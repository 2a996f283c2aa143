"""PyTorch peer baseline: what a PyTorch user writes for the same computation.

Gather the dilated rows of each pattern and head offset, run
``scaled_dot_product_attention``'s fastest kernel that also returns the
log-sum-exp (cuDNN, else flash, for 16 bits; memory-efficient for float32 and
float64), and merge patterns by log-sum-exp in at least FP32. Same semantics as every other
backend; it is the baseline every benchmark compares against. Gradients: the same kernel's SDPA
backward op per pattern and head offset, given the merged output and log-sum-exp (ring-flash-attention
style), in an autograd Function. The gather, the merge and the backward are
``backends/gather_merge.py``'s, with :data:`SDPA` as the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from hilbert_hpc.backends.base import Backend
from hilbert_hpc.backends.gather_merge import (AttentionKernel, gathered_backward_bytes, merged_attention,
                                               merged_attention_backward, peer_attention)
from hilbert_hpc.backends.memory import BackendMemory, Placed, RankShape
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
#: docs/performance.md); float32 has only the memory-efficient kernel, float64 none (``math``: the attention of
#: each gathered batch as plain matrix products, its full score matrix in memory; for checks, not speed)
CUDA_SDPA_ORDER = {2: ("cudnn", "flash", "efficient"), 4: ("efficient",), 8: ("math",)}
#: (dtype, head dim, causal) -> the first kernel of the order that ran for it on CUDA in this process
_sdpa_chosen: dict[tuple, str] = {}
#: the memory-efficient kernel's log-sum-exp has its rows padded to a multiple of this
EFFICIENT_LSE_ROWS = 32


def _math_scores(q: Any, k: Any, causal: bool, scale: float) -> Any:
    """Scaled scores of (B, H, L, D) tensors, -inf above the diagonal when causal."""
    import torch

    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return s


def _sdpa(kind: str, q: Any, k: Any, v: Any, causal: bool, scale: float) -> tuple[Any, Any]:
    """One SDPA kernel on (B, H, L, D) tensors: (output, log-sum-exp (B, H, L) in float32)."""
    import torch

    aten = torch.ops.aten
    if kind == "math":
        s = _math_scores(q, k, causal, scale)
        lse = torch.logsumexp(s, dim=-1)
        return torch.matmul(torch.exp(s - lse[..., None]), v), lse
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
    if kind == "math":
        p = torch.exp(_math_scores(q, k, causal, scale) - lse[..., None])
        ds = p * (torch.matmul(dout, v.transpose(-1, -2)) - (dout * out).sum(-1, keepdim=True))
        return (torch.matmul(ds, k) * scale, torch.matmul(ds.transpose(-1, -2), q) * scale,
                torch.matmul(p.transpose(-1, -2), dout))
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


class SdpaKernel:
    """``scaled_dot_product_attention`` as a peer's attention kernel (``gather_merge.AttentionKernel``), on
    (B, H, L, D) batches: :func:`sdpa_with_lse` forward, the backward op of the kernel it chose."""

    heads_first = True

    def forward(self, q: Any, k: Any, v: Any, causal: bool, scale: float) -> tuple[Any, Any]:
        """:func:`sdpa_with_lse` on (B, H, L, D) tensors."""
        return sdpa_with_lse(q, k, v, causal, scale)

    def backward(self, dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, causal: bool,
                 scale: float) -> tuple[Any, Any, Any]:
        """The backward op of the SDPA kernel the forward ran for these tensors (:func:`sdpa_kernel`; the CPU
        flash kernel's for CPU tensors), given ``out`` and ``lse``."""
        kind = sdpa_kernel(q.dtype, q.shape[-1], causal) if q.is_cuda else "cpu"
        return _sdpa_backward(kind, dout, q, k, v, out, lse, causal, scale)


#: the torch peer's kernel
SDPA = SdpaKernel()


@dataclass(frozen=True)
class PeerMemory(BackendMemory):
    """What a peer holds: the gathered copies of its patterns and head offsets, forward and backward; counted on
    the GPU nodes' GPU when the plan is for them, else where the peer runs on this machine (on its host where
    torch does not import here), or with ``gpu_only`` always on a GPU."""

    gpu_only: bool = False

    def workspace_bytes(self, shape: RankShape) -> int:
        """The gathered copies: ``TORCH_WORKSPACE`` times the Q/K/V/O bytes (measured)."""
        return int(TORCH_WORKSPACE * self.qkvo_bytes(shape))

    def backward_workspace_bytes(self, shape: RankShape) -> int:
        """The gathered copies of the backward's largest pattern and head offset (``gathered_backward_bytes``)."""
        return gathered_backward_bytes(shape.shard, shape.heads, shape.head_dim, shape.itemsize, shape.patterns)

    def counted_on_gpu(self, backend: Placed, gpu_nodes: bool | None) -> bool:
        """On a GPU with ``gpu_only`` or on GPU nodes (``gpu_nodes``), otherwise as the peer runs here."""
        if self.gpu_only:
            return True
        if gpu_nodes is not None:
            return gpu_nodes
        return backend.usable() is None and backend.on_gpu


class TorchPeer(Backend):
    """The PyTorch peer: SDPA per pattern and head offset, merged by log-sum-exp; one process only."""

    name = "torch"
    passes = ("forward", "forward+backward")
    dtypes = ("float64", "float32", "bfloat16", "float16")
    requires = ("torch",)
    #: the peer runs on one process: it is the single-device baseline
    attend_fn = None
    #: the dense attention kernel it runs per pattern and head offset
    attention: AttentionKernel = SDPA
    memory = PeerMemory()

    @property
    def on_gpu(self) -> bool:  # type: ignore[override]
        """True when torch sees a CUDA device (the peer follows the machine)."""
        import torch

        return torch.cuda.is_available()

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

        The peer's ``attention`` kernel runs in the input dtype; the merge of patterns, the running output and
        the log-sum-exp are at least FP32; the output has the input dtype. Differentiable: when an input
        requires a gradient (and grad mode is on), the forward keeps the output and the merged log-sum-exp and
        the backward runs the kernel's backward per pattern and head offset with them (plain autograd through
        the merge would be wrong: SDPA's backward drops its log-sum-exp's gradient); otherwise nothing is kept
        (:func:`~hilbert_hpc.backends.gather_merge.peer_attention`).
        """
        return peer_attention(self.attention, qs, ks, vs, patterns, causal, scale)

    def serialized_forward(self, qs: Any, ks: Any, vs: Any, patterns: Sequence[Pattern], causal: bool,
                           scale: float, kernel: KernelChoice | None = None) -> tuple[Any, Any]:
        """The peer's forward as its autograd Function runs it: the output in the input dtype (what the
        kernel's backward takes) and the merged log-sum-exp in at least FP32."""
        out, lse = merged_attention(self.attention, qs, ks, vs, patterns, causal, scale)
        return (out if out.dtype == qs.dtype else out.to(qs.dtype)), lse

    def serialized_backward(self, qs: Any, ks: Any, vs: Any, out: Any, lse: Any, dout: Any,
                            patterns: Sequence[Pattern], causal: bool, scale: float,
                            kernel: KernelChoice | None = None) -> tuple[Any, Any, Any]:
        """The peer's backward as its autograd Function runs it: the kernel's backward per pattern and head
        offset with the merged output and log-sum-exp, gradients in the input dtype."""
        return merged_attention_backward(self.attention, dout, qs, ks, vs, out, lse, patterns, causal, scale)
