"""Fused FP32 kernels applied to dilated attention: local patterns and packed ring blocks, merged in place.

Each call launches :mod:`hilbert_hpc.kernels`' FP32 kernel with element-offset
geometry, so Q rows are read where they lie in the shard (segment, dilation and
offset indexing), K/V rows from the shard or from a packed ring block, and the
result is merged by log-sum-exp into the running output and LSE.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from .patterns import Pattern

Array = Any


def _launch(q: Array, k: Array, v: Array, out: Array, lse: Array, *, qg: tuple, kg: tuple, vg: tuple, lg: tuple,
            segments: int, heads: int, mq: int, mk: int, shift: int | None, scale: float, head_dim: int) -> None:
    """One kernel launch over ``segments x heads`` problems (geometry tuples: base, seg, head, row strides)."""
    from . import kernels

    if segments == 0 or heads == 0 or mq == 0 or mk == 0:
        return
    align = math.gcd(*qg, *kg, *vg, 16)
    chosen = kernels.select_fp32(head_dim, align)
    fn = kernels.compiled(chosen)
    grid = (segments * heads, -(-mq // chosen.block_queries))
    args = (q, k, v, out, lse, *(np.int64(x) for x in (*qg, *kg, *vg, *lg)),
            np.int32(heads), np.int32(mq), np.int32(mk), np.int32(shift is not None),
            np.int32(shift or 0), np.float32(scale))
    fn(grid, (chosen.threads,), args, shared_mem=chosen.shared_bytes)


def check_arrays(*arrays: Array) -> None:
    """The fused path takes C-contiguous float32 CuPy arrays."""
    for a in arrays:
        if a.dtype != np.float32 or not a.flags.c_contiguous:
            raise ValueError("the fused FP32 kernels need C-contiguous float32 arrays")


def local_patterns(qs: Array, ks: Array, vs: Array, patterns: Sequence[Pattern], causal: bool, scale: float,
                   out: Array, lse: Array) -> None:
    """Patterns whose segments lie inside these (n, H, D) arrays, merged into ``out``/``lse``."""
    check_arrays(qs, ks, vs, out, lse)
    n, heads, d = qs.shape
    row, hrow = heads * d, heads
    for p in patterns:
        w, r, m = p.segment, p.dilation, p.selected
        for o in range(min(r, heads)):
            nh = len(range(o, heads, r))
            base = o * row + o * d          # row o of the segment, head o
            geo = (base, w * row, r * d, r * row)
            _launch(qs, ks, vs, out, lse, qg=geo, kg=geo, vg=geo, lg=(o * hrow + o, w * hrow, r, r * hrow),
                    segments=n // w, heads=nh, mq=m, mk=m, shift=0 if causal else None, scale=scale, head_dim=d)


def ring_block(qs: Array, block: Array, geom: Any, pos: int, src: int, shift: int | None, scale: float,
               out: Array, lse: Array) -> None:
    """Attend this rank's selected queries to a packed ring block from ring position ``src``; merge in place."""
    n, heads, d = qs.shape
    row, hrow = heads * d, heads
    for (o, mk, k0, v0) in geom.layout(src):
        rows = geom.rows(pos, o)
        mq = len(range(rows.start, rows.stop, rows.step))
        nh = geom.nheads(o)
        r = geom.pattern.dilation
        qg = (rows.start * row + o * d, 0, r * d, r * row)
        _launch(qs, block, block, out, lse, qg=qg, kg=(k0, 0, d, nh * d), vg=(v0, 0, d, nh * d),
                lg=(rows.start * hrow + o, 0, r, r * hrow), segments=1, heads=nh, mq=mq, mk=mk,
                shift=shift, scale=scale, head_dim=d)
