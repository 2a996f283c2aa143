"""Gather, attend, merge: the peers' dilated attention around a dense attention kernel that returns its LSE.

Per pattern and head offset the selected rows are gathered into a dense batch, an attention kernel runs on it
and returns its output and log-sum-exp, and the patterns are merged by log-sum-exp in at least FP32. The
backward runs the kernel's backward per pattern and head offset with the merged output and log-sum-exp
(docs/semantics.md, section 10) and scatter-adds the gradients in at least FP32. The kernel is a parameter
(:class:`AttentionKernel`): SDPA for the ``torch`` peer (``backends/torch_peer.py``), FlashAttention-4 for
the ``flash`` peer (``backends/flash_peer.py``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Protocol, Sequence

from hilbert_hpc.core.patterns import Pattern


class AttentionKernel(Protocol):
    """Dense attention with its log-sum-exp, forward and backward, on gathered batches of one layout."""

    #: True: the kernel takes (batch, heads, rows, D) tensors (SDPA); False: (batch, rows, heads, D) (FA4)
    heads_first: bool

    def forward(self, q: Any, k: Any, v: Any, causal: bool, scale: float) -> tuple[Any, Any]:
        """(output in the kernel's layout, log-sum-exp (batch, heads, rows), natural log)."""
        ...

    def backward(self, dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, causal: bool,
                 scale: float) -> tuple[Any, Any, Any]:
        """(dQ, dK, dV) in the kernel's layout, given the output ``out`` and log-sum-exp ``lse`` (batch, heads,
        rows) to use for the probabilities: exp(S - lse) and Delta = rowsum(dout * out)."""
        ...


def _rows(x: Any, p: Pattern, heads: int, o: int) -> Any:
    """The rows of serialized ``x`` (N, H, ...) that pattern ``p`` selects for the heads of offset ``o``, as a
    view (segments, selected rows, heads with offset o, ...)."""
    return x.view(x.shape[0] // p.segment, p.selected, p.dilation, heads, *x.shape[2:])[:, :, o, o::p.dilation]


def _gather(kernel: AttentionKernel, x: Any, p: Pattern, heads: int, o: int) -> Any:
    """:func:`_rows` of an (N, H, D) tensor as a contiguous batch in ``kernel``'s layout."""
    rows = _rows(x, p, heads, o)
    return (rows.permute(0, 2, 1, 3) if kernel.heads_first else rows).contiguous()


def _as_rows(kernel: AttentionKernel, part: Any) -> Any:
    """A batch in ``kernel``'s layout as a (segments, selected rows, heads, D) view, the layout of :func:`_rows`."""
    return part.permute(0, 2, 1, 3) if kernel.heads_first else part


def merged_attention(kernel: AttentionKernel, qs: Any, ks: Any, vs: Any, patterns: Sequence[Pattern],
                     causal: bool, scale: float) -> tuple[Any, Any]:
    """``kernel`` per pattern and head offset merged by log-sum-exp: (output (N, H, Dv), log-sum-exp (N, H)),
    both in at least FP32 (float64 for float64 inputs); rows no pattern selects have output 0 and -inf."""
    import torch

    n, heads, _ = qs.shape
    acc = torch.promote_types(qs.dtype, torch.float32)
    out = torch.zeros((n, heads, vs.shape[-1]), dtype=acc, device=qs.device)
    lse = torch.full((n, heads), float("-inf"), dtype=acc, device=qs.device)
    for p in patterns:
        for o in range(min(p.dilation, heads)):
            part, part_lse = kernel.forward(_gather(kernel, qs, p, heads, o), _gather(kernel, ks, p, heads, o),
                                            _gather(kernel, vs, p, heads, o), causal, scale)
            dst, dst_lse = _rows(out, p, heads, o), _rows(lse, p, heads, o)
            part = _as_rows(kernel, part).to(acc)
            part_lse = part_lse.permute(0, 2, 1).to(acc)
            new_lse = torch.logaddexp(dst_lse, part_lse)
            dst.copy_(dst * torch.exp(dst_lse - new_lse)[..., None]
                      + part * torch.exp(part_lse - new_lse)[..., None])
            dst_lse.copy_(new_lse)
    return out, lse


#: What the backward of one pattern and head offset holds at once, in gathered copies: its five gathered inputs
#: (dO, Q, K, V, O), the kernel's three gradients and about one more of the kernel's own working memory (torch's
#: memory-efficient float32 kernel ran out of memory there at N = 4M, H = 8, D = 64 on one H200)
GATHERED_BACKWARD_COPIES = 9


def gathered_backward_bytes(shard: int, heads: int, head_dim: int, itemsize: int,
                            patterns: Sequence[Pattern]) -> int:
    """The most working memory :func:`merged_attention_backward` holds for a shard (for ``plan``): the copies of
    its largest gathered pattern and head offset (``shard / r`` rows of ``ceil(heads / r)`` heads)."""
    largest = max((shard // p.dilation * -(-heads // p.dilation) for p in patterns), default=0)
    return GATHERED_BACKWARD_COPIES * largest * head_dim * itemsize


def merged_attention_backward(kernel: AttentionKernel, dout: Any, qs: Any, ks: Any, vs: Any, out: Any, lse: Any,
                              patterns: Sequence[Pattern], causal: bool, scale: float) -> tuple[Any, Any, Any]:
    """(dQ, dK, dV) of :func:`merged_attention` in the input dtype, from the merged output ``out`` (in the input
    dtype) and log-sum-exp ``lse``: per pattern and head offset, ``kernel``'s backward on the gathered rows with
    ``out`` and ``lse`` restricted to them, scatter-added in at least FP32 (16-bit gradients are rounded once,
    at the end)."""
    import torch

    heads = qs.shape[1]
    acc = torch.promote_types(qs.dtype, torch.float32)
    dout = dout.to(qs.dtype).contiguous()
    grads = [torch.zeros(x.shape, dtype=acc, device=x.device) for x in (qs, ks, vs)]
    for p in patterns:
        for o in range(min(p.dilation, heads)):
            parts = kernel.backward(*(_gather(kernel, x, p, heads, o) for x in (dout, qs, ks, vs, out)),
                                    _rows(lse, p, heads, o).permute(0, 2, 1), causal, scale)
            for grad, part in zip(grads, parts):
                _rows(grad, p, heads, o).add_(_as_rows(kernel, part))
    return tuple(g if g.dtype == qs.dtype else g.to(qs.dtype) for g in grads)  # type: ignore[return-value]


@lru_cache(maxsize=None)
def peer_function() -> Any:
    """The peers' ``torch.autograd.Function`` (made on first use: torch is imported only when a peer runs).

    ``apply(qs, ks, vs, kernel, patterns, causal, scale)``. Forward: :func:`merged_attention`, keeping the
    inputs, the output (in the input dtype, as the kernels' backward takes it) and the merged log-sum-exp, never
    a per-pattern copy; backward: :func:`merged_attention_backward` with the same kernel.
    """
    import torch

    class PeerAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, qs: Any, ks: Any, vs: Any, kernel: AttentionKernel, patterns: tuple[Pattern, ...],
                    causal: bool, scale: float) -> Any:
            out, lse = merged_attention(kernel, qs, ks, vs, patterns, causal, scale)
            out = out if out.dtype == qs.dtype else out.to(qs.dtype)
            ctx.save_for_backward(qs, ks, vs, out, lse)
            ctx.kernel, ctx.patterns, ctx.causal, ctx.scale = kernel, patterns, causal, scale
            return out

        @staticmethod
        def backward(ctx: Any, dout: Any) -> tuple[Any, ...]:
            grads = merged_attention_backward(ctx.kernel, dout, *ctx.saved_tensors, ctx.patterns, ctx.causal,
                                              ctx.scale)
            return (*grads, None, None, None, None)

    return PeerAttention


def peer_attention(kernel: AttentionKernel, qs: Any, ks: Any, vs: Any, patterns: Sequence[Pattern], causal: bool,
                   scale: float) -> Any:
    """Dilated attention of serialized (N, H, D) tensors with ``kernel`` -> serialized output (N, H, Dv) in the
    input dtype; differentiable (:func:`peer_function`) when an input requires a gradient and grad mode is on,
    otherwise nothing is kept."""
    import torch

    if torch.is_grad_enabled() and any(x.requires_grad for x in (qs, ks, vs)):
        return peer_function().apply(qs, ks, vs, kernel, tuple(patterns), causal, scale)
    out, _ = merged_attention(kernel, qs, ks, vs, patterns, causal, scale)
    return out if out.dtype == qs.dtype else out.to(qs.dtype)      # 16-bit inputs: a 16-bit output
