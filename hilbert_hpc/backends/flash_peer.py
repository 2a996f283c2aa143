"""FlashAttention-4 peer: the torch peer's gather and merge around FlashAttention-4, forward and backward.

What a Hopper user writes with the fastest dense attention there is: gather the dilated rows of each pattern
and head offset as (segments, rows, heads, D) batches, run FlashAttention-4's forward (``flash_attn.cute``,
the ``flash-attn-4`` package; ``pip install 'hilbert_hpc[flash]'``) with its log-sum-exp, and merge the
patterns by log-sum-exp in FP32 (``backends/gather_merge.py``, as the ``torch`` peer does with SDPA).
Gradients: FlashAttention-4's backward per pattern and head offset, given the merged output (in the input's
16-bit dtype, as it takes it) and the merged FP32 log-sum-exp (docs/semantics.md, section 10), scatter-added
in FP32 and rounded once. bfloat16 and float16 only, on one CUDA GPU of compute capability 9.0 or newer (its
backward runs on 9.x and newer), one process only.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hilbert_hpc.backends.base import Backend
from hilbert_hpc.backends.gather_merge import AttentionKernel
from hilbert_hpc.backends.torch_peer import PeerMemory, TorchPeer
from hilbert_hpc.errors import ConfigError

if TYPE_CHECKING:
    from hilbert_hpc.kernels.selection import KernelChoice

#: the module of FlashAttention-4 (CuTe DSL) the peer runs
FA4_MODULE = "flash_attn.cute"
#: the oldest compute capability (major, minor) the peer runs on: FlashAttention-4's backward needs 9.x or newer
FA4_MIN_CC = (9, 0)
#: head dims FlashAttention-4 takes on Hopper, 16-bit: 8 to 256 in multiples of 8
FA4_HEAD_DIMS = range(8, 257, 8)


class Fa4Kernel:
    """FlashAttention-4 as a peer's attention kernel (``gather_merge.AttentionKernel``), on (B, L, H, D)
    batches of 16-bit CUDA tensors."""

    heads_first = False

    def forward(self, q: Any, k: Any, v: Any, causal: bool, scale: float) -> tuple[Any, Any]:
        """FlashAttention-4's forward: (output (B, L, H, D), log-sum-exp (B, H, L) in float32, natural log)."""
        from flash_attn.cute.interface import _flash_attn_fwd

        out, lse, *_ = _flash_attn_fwd(q, k, v, softmax_scale=scale, causal=causal, return_lse=True)
        return out, lse

    def backward(self, dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, causal: bool,
                 scale: float) -> tuple[Any, Any, Any]:
        """FlashAttention-4's backward with the given output and log-sum-exp: (dQ, dK, dV) (B, L, H, D)."""
        from flash_attn.cute.interface import _flash_attn_bwd

        dq, dk, dv = _flash_attn_bwd(q, k, v, out, dout, lse.contiguous(), scale, causal)
        return dq, dk, dv


#: the flash peer's kernel
FA4 = Fa4Kernel()


def fa4_missing() -> str | None:
    """Why FlashAttention-4 cannot be imported here, with how to install it (the end of a sentence after the
    backend's name), or None."""
    try:
        importlib.import_module(FA4_MODULE)
    except ImportError as exc:
        return f"needs FlashAttention-4 (pip install 'hilbert_hpc[flash]'): {FA4_MODULE} is not importable ({exc})"
    return None


def flash_unusable() -> str | None:
    """Why FlashAttention-4 cannot run here (no torch, no CUDA device for torch, no ``flash_attn.cute``, a GPU
    below compute capability 9.0), as the end of a sentence after the backend's name, or None."""
    try:
        import torch
    except ImportError as exc:
        return f"needs torch ({exc})"
    if not torch.cuda.is_available():
        return "needs a CUDA GPU of compute capability 9.0 or newer; torch sees none"
    missing = fa4_missing()
    if missing:
        return missing
    cc = tuple(torch.cuda.get_device_capability())
    if cc < FA4_MIN_CC:
        return (f"needs a GPU of compute capability {FA4_MIN_CC[0]}.{FA4_MIN_CC[1]} or newer (FlashAttention-4's "
                f"backward); this one is {cc[0]}.{cc[1]}")
    return None


class FlashPeer(TorchPeer):
    """The FlashAttention-4 peer: FA4 per pattern and head offset, merged by log-sum-exp; one process, one GPU."""

    name = "flash"
    dtypes = ("bfloat16", "float16")
    #: torch; FlashAttention-4 is checked by :meth:`require`, which says how to install it
    requires = ("torch",)
    attention: AttentionKernel = FA4
    #: FlashAttention-4 runs only on GPUs: a plan counts its memory there wherever it is made
    memory = PeerMemory(gpu_only=True)

    @property
    def on_gpu(self) -> bool:  # type: ignore[override]
        """Always: FlashAttention-4 runs only on CUDA GPUs."""
        return True

    def require(self, param: str = "backend") -> Backend:
        """This backend with torch and FlashAttention-4 imported; a ConfigError names the one missing (for
        FlashAttention-4: how to install it)."""
        super().require(param)
        missing = fa4_missing()
        if missing:
            raise ConfigError(f"backend {self.name!r} {missing}", param)
        return self

    def usable(self) -> str | None:
        """:func:`flash_unusable`."""
        return flash_unusable()

    def check(self, head_dim: int, dtype: str, ranks: int) -> KernelChoice | None:
        """Refuse a head dim FlashAttention-4 does not take (ValueError); no kernel of the project's own."""
        if head_dim not in FA4_HEAD_DIMS:
            raise ValueError(f"backend 'flash' (FlashAttention-4) takes head_dim 8 to 256 in multiples of 8, "
                             f"not {head_dim}")
        return super().check(head_dim, dtype, ranks)
