"""Dilated attention on a serialized sequence held by one process (docs/semantics.md, sections 3-5).

Works for any NumPy-like array module: the selection of a pattern/offset is a
strided view (segments x selected rows x heads), never a gathered index list.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from hilbert_hpc.core.blockwise import accumulator_dtype, array_module, attend, merge_lse
from hilbert_hpc.core.patterns import Pattern

Array = Any
AttendFn = Callable[..., tuple[Array, Array]]


def offset_groups(pattern: Pattern, heads: int) -> list[tuple[int, slice]]:
    """Heads grouped by their offset ``h mod r``: ``[(offset, slice of heads), ...]``."""
    return [(o, slice(o, heads, pattern.dilation)) for o in range(min(pattern.dilation, heads))]


def segment_view(x: Array, pattern: Pattern) -> Array:
    """View (N, H, ...) as (segments, selected, dilation, H, ...) without copying."""
    n = x.shape[0]
    return x.reshape(n // pattern.segment, pattern.selected, pattern.dilation, *x.shape[1:])


def accumulate_patterns(qs: Array, ks: Array, vs: Array, patterns: Sequence[Pattern], causal: bool,
                        scale: float, out: Array, lse: Array, attend_fn: AttendFn = attend) -> None:
    """Merge the dilated attention of ``patterns`` (segments inside these arrays) into ``out``/``lse``.

    ``qs``, ``ks``, ``vs``: serialized (n, H, D) rows whose first row starts a
    segment of every pattern; ``out`` (n, H, Dv) and ``lse`` (n, H) hold earlier
    partial results in the accumulator dtype and are updated in place by log-sum-exp.
    """
    xp = array_module(qs)
    heads = qs.shape[1]
    for p in patterns:
        q_seg, k_seg, v_seg = segment_view(qs, p), segment_view(ks, p), segment_view(vs, p)
        o_seg, l_seg = segment_view(out, p), segment_view(lse, p)
        for o, hs in offset_groups(p, heads):
            # (segments, heads in group, selected, D): one attention problem per segment and head
            q = xp.ascontiguousarray(q_seg[:, :, o, hs].transpose(0, 2, 1, 3))
            k = xp.ascontiguousarray(k_seg[:, :, o, hs].transpose(0, 2, 1, 3))
            v = xp.ascontiguousarray(v_seg[:, :, o, hs].transpose(0, 2, 1, 3))
            part_out, part_lse = attend_fn(q, k, v, scale, 0 if causal else None)
            merge_lse(o_seg[:, :, o, hs], l_seg[:, :, o, hs],
                      part_out.transpose(0, 2, 1, 3), part_lse.transpose(0, 2, 1))


def empty_accumulators(xp: Any, n: int, heads: int, dv: int, dtype: Any, zeros: bool = True) -> tuple[Array, Array]:
    """Output zeros (n, H, Dv) (uninitialized when not ``zeros``) and log-sum-exp -inf (n, H) in the accumulator
    dtype of ``dtype``."""
    acc = accumulator_dtype(dtype)
    return (xp.zeros if zeros else xp.empty)((n, heads, dv), dtype=acc), xp.full((n, heads), -np.inf, dtype=acc)


def local_dilated_forward(qs: Array, ks: Array, vs: Array, patterns: Sequence[Pattern], causal: bool,
                          scale: float, attend_fn: AttendFn = attend) -> tuple[Array, Array]:
    """Dilated attention of serialized (N, H, D) arrays with its merged log-sum-exp.

    Returns the serialized output (N, H, Dv) and the merged log-sum-exp ``L``
    (N, H) (docs/semantics.md, section 5), both in the accumulator dtype: every
    pattern acts on every head (offset ``h mod r``); partial results merge by
    log-sum-exp; positions no pattern selects stay 0 / -inf. ``L`` is what the
    backward needs besides the output (section 10).
    """
    xp = array_module(qs)
    out, lse = empty_accumulators(xp, qs.shape[0], qs.shape[1], vs.shape[-1], qs.dtype)
    accumulate_patterns(qs, ks, vs, patterns, causal, scale, out, lse, attend_fn)
    return out, lse


def local_dilated_attention(qs: Array, ks: Array, vs: Array, patterns: Sequence[Pattern], causal: bool,
                            scale: float, attend_fn: AttendFn = attend) -> Array:
    """The serialized output (N, H, Dv) of :func:`local_dilated_forward`, without its log-sum-exp."""
    return local_dilated_forward(qs, ks, vs, patterns, causal, scale, attend_fn)[0]
