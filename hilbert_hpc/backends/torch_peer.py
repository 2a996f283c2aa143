"""PyTorch peer baseline: what a PyTorch user writes for the same computation.

Gather the dilated rows of each pattern and head offset, run
``scaled_dot_product_attention``'s fastest kernel that also returns the
log-sum-exp (cuDNN, else flash, for 16 bits; memory-efficient for float32 and
float64), and merge patterns by log-sum-exp in at least FP32. Same semantics as every other
backend; it is the baseline every benchmark compares against.
"""

from __future__ import annotations

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
#: (dtype, head dim, causal) -> the first kernel of the order that ran for it in this process
_sdpa_chosen: dict[tuple, str] = {}


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


def sdpa_kernel(dtype: Any, head_dim: int, causal: bool) -> str | None:
    """The SDPA kernel the peer runs for these tensors in this process ('cudnn', 'flash', 'efficient', 'cpu'),
    or None before its first call."""
    return _sdpa_chosen.get((dtype, head_dim, causal))


def sdpa_with_lse(q: Any, k: Any, v: Any, causal: bool, scale: float) -> tuple[Any, Any]:
    """``scaled_dot_product_attention`` on (B, H, L, D) tensors, also returning the log-sum-exp (B, H, L): the
    fastest kernel of ``CUDA_SDPA_ORDER`` that takes them (chosen at the first call for their dtype, head dim
    and causality, then kept), the flash kernel for CPU tensors."""
    key = (q.dtype, q.shape[-1], causal)
    chosen = _sdpa_chosen.get(key)
    if chosen is not None:
        return _sdpa(chosen, q, k, v, causal, scale)
    import torch

    kinds = CUDA_SDPA_ORDER[q.element_size()] if q.is_cuda else ("cpu",)
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
        least FP32; the output has the input dtype. Not differentiable: SDPA's backward ignores the gradient
        of its log-sum-exp, through which the merge depends on Q and K, so autograd would return dQ and dK
        silently wrong wherever patterns merge (a third off on a small causal case); inputs that require a
        gradient are refused.
        """
        import torch

        if torch.is_grad_enabled() and any(x.requires_grad for x in (qs, ks, vs)):
            raise NotImplementedError("the torch peer's forward is not differentiable through its log-sum-exp "
                                      "merge (SDPA drops the log-sum-exp's gradient); use hilbert_hpc.nn for "
                                      "gradients")

        n, heads, _ = qs.shape
        acc = torch.promote_types(qs.dtype, torch.float32)
        out = torch.zeros((n, heads, vs.shape[-1]), dtype=acc, device=qs.device)
        lse = torch.full((n, heads), float("-inf"), dtype=acc, device=qs.device)
        for p in patterns:
            nseg, m, r = n // p.segment, p.selected, p.dilation

            def rows(x: Any, o: int) -> Any:
                # (segments, heads with offset o, selected rows, D): one SDPA batch entry per segment/head
                return x.view(nseg, m, r, heads, x.shape[-1])[:, :, o, o::r].permute(0, 2, 1, 3).contiguous()

            for o in range(min(r, heads)):
                part, part_lse = sdpa_with_lse(rows(qs, o), rows(ks, o), rows(vs, o), causal, scale)
                dst = out.view(nseg, m, r, heads, -1)[:, :, o, o::r]
                dst_lse = lse.view(nseg, m, r, heads)[:, :, o, o::r]
                part = part.permute(0, 2, 1, 3).to(acc)
                part_lse = part_lse.permute(0, 2, 1).to(acc)
                new_lse = torch.logaddexp(dst_lse, part_lse)
                dst.copy_(dst * torch.exp(dst_lse - new_lse)[..., None]
                          + part * torch.exp(part_lse - new_lse)[..., None])
                dst_lse.copy_(new_lse)
        return out if out.dtype == qs.dtype else out.to(qs.dtype)      # 16-bit inputs: a 16-bit output
