"""The launch geometry of the fused kernels: local patterns and packed ring blocks, merged in place.

Each call launches one fused kernel with element-offset geometry, so Q rows are
read where they lie in the shard (segment, dilation and offset indexing), K/V
rows from the shard or from a packed ring block, and the result is merged by
log-sum-exp into the running output and LSE. :class:`FusedKernels` holds that
geometry for any launcher with the kernels' common argument list: the FP32
provider (:mod:`hilbert_hpc.kernels.fp32`, float32 CuPy arrays) and the 16-bit
provider (:mod:`hilbert_hpc.kernels.sixteen_bit`, whose output stays 16-bit); the backward kernels
(:mod:`hilbert_hpc.kernels.backward`) take the same geometry. This module knows no provider and no GPU.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable, Sequence

import numpy as np

from hilbert_hpc.core.launch_geometry import coalesce_heads

Array = Any
#: launch(q, k, v, out, lse, *, qg, kg, vg, lg, segments, heads, mq, mk, shift, scale, head_dim)
Launcher = Callable[..., None]


#: most blocks a launch may have along grid y (the query blocks of one problem)
MAX_GRID_Y = 65535


#: the kernels' ``DILATED_GEOMETRY_PARAMS`` (common.cuh), name for name and type for type: element offsets and
#: strides of Q, K, V and L (int64), heads, mq, mk, causal, causal shift (int32), scale (float32)
GEOMETRY: tuple[tuple[str, type], ...] = (
    *((f"{a}_{b}", np.int64) for a in "qkvl" for b in ("base", "seg", "head", "row")),
    *((name, np.int32) for name in ("heads", "mq", "mk", "causal", "causal_shift")), ("scale", np.float32))


def geometry_arguments(qg: tuple, kg: tuple, vg: tuple, lg: tuple, heads: int, mq: int, mk: int, shift: int | None,
                       scale: float) -> tuple:
    """The arguments after the array pointers of every attention kernel but tma16 (``DILATED_GEOMETRY_PARAMS``,
    common.cuh), typed as :data:`GEOMETRY`: the base, segment, head and row strides of Q, K, V and L, heads, mq, mk,
    causal, causal shift (0 without one) and scale."""
    values = (*qg, *kg, *vg, *lg, heads, mq, mk, shift is not None, shift or 0, scale)
    return tuple(kind(value) for (_, kind), value in zip(GEOMETRY, values, strict=True))


def query_chunks(qg: tuple, lg: tuple, mq: int, shift: int | None, block_queries: int,
                 max_blocks: int = MAX_GRID_Y) -> list[tuple[tuple, tuple, int, int | None]]:
    """``(qg, lg, mq, shift)`` of launches that together cover ``mq`` query rows with at most ``max_blocks``
    query blocks each: a chunk starting at row ``c`` moves the Q/output and log-sum-exp bases by ``c`` rows
    and the causal shift by ``c`` (query ``i`` of the chunk is query ``c + i`` of the problem)."""
    rows = max_blocks * block_queries
    return [((qg[0] + c * qg[3], *qg[1:]), (lg[0] + c * lg[3], *lg[1:]), min(rows, mq - c),
             None if shift is None else shift + c) for c in range(0, mq, rows)]


def segment_dilation(p: Any) -> tuple[int, int]:
    """(segment, dilation) of a ``Pattern`` or a ``(segment, dilation)`` pair."""
    return (int(p.segment), int(p.dilation)) if hasattr(p, "segment") else (int(p[0]), int(p[1]))


def local_launches(patterns: Sequence[Any], causal: bool, scale: float, n: int, heads: int, head_dim: int,
                   first_head: int = 0, end_head: int | None = None, out_heads: int | None = None) -> list[dict]:
    """The launches (keyword arguments of a launcher) of ``patterns`` (``Pattern`` or ``(segment, dilation)``)
    whose segments lie inside (n, heads, head_dim) arrays: one per pattern and head offset o (heads o, o + r,
    ...; row o of each segment), in the given order, offsets ascending. Heads ``first_head .. end_head - 1``
    only, when given; ``out_heads``: the output is a separate array (n, out_heads, head_dim) holding those
    heads from its head 0 on, addressed by the output geometry ``og`` (otherwise the output is laid out as Q)."""
    end_head = heads if end_head is None else end_head
    d, row, hrow = head_dim, heads * head_dim, heads
    launches = []
    for p in patterns:
        w, r = segment_dilation(p)
        m = w // r
        for o in range(min(r, heads)):
            first = o + r * max(0, -(-(first_head - o) // r))    # the first head >= first_head with offset o
            if first >= end_head:
                continue
            geo = (o * row + first * d, w * row, r * d, r * row)
            launch = dict(qg=geo, kg=geo, vg=geo, lg=(o * hrow + first, w * hrow, r, r * hrow), segments=n // w,
                          heads=len(range(first, end_head, r)), mq=m, mk=m, shift=0 if causal else None,
                          scale=scale, head_dim=d)
            if out_heads is not None:
                orow = out_heads * d
                launch["og"] = (o * orow + (first - first_head) * d, w * orow, r * d, r * orow)
            launches.append(launch)
    return launches


def ring_launches(geom: Any, pos: int, src: int, pair: Any, scale: float, heads: int, head_dim: int) -> list[dict]:
    """The launches (keyword arguments of a launcher) of ring position ``pos``'s selected queries of piece
    ``pair.query`` against piece ``pair.key`` of the packed block of ring position ``src`` (``geom``: a
    ``distributed.ring.RingPattern``, ``pair`` a ``PiecePair``), one per head offset with rows on both sides: Q
    (and the output, dO, dQ) and the log-sum-exp (and delta) addressed in the (n, heads, head_dim) shard, K and V
    (and dK, dV in an accumulator block of the same layout) at the part's element offsets in the block; offsets
    of one head each in one launch where their rows line up (:func:`coalesce_heads`)."""
    d, row, hrow = head_dim, heads * head_dim, heads
    r = geom.pattern.dilation
    launches = []
    for i, o in enumerate(geom.offsets):
        part = geom.part(src, i, pair.key)
        rows = geom.rows(pos, pair.query, o)
        mq = len(range(rows.start, rows.stop, rows.step))
        if mq == 0 or part.rows == 0:
            continue
        nh = geom.nheads(o)
        launches.append(dict(qg=(rows.start * row + o * d, 0, r * d, r * row), kg=(part.k0, 0, d, nh * d),
                             vg=(part.v0, 0, d, nh * d), lg=(rows.start * hrow + o, 0, r, r * hrow), segments=1,
                             heads=nh, mq=mq, mk=part.rows, shift=pair.shift, scale=scale, head_dim=d))
    return coalesce_heads(launches)


@lru_cache(maxsize=1024)
def hop_launches(geom: Any, pos: int, src: int, pair: Any, scale: float, heads: int, head_dim: int) -> tuple[dict, ...]:
    """:func:`ring_launches` worked out once per case and hop (``geom``, the case's ``RingPattern``, keyed by
    identity), for the providers that launch them at every hop; the launches are read, never changed."""
    return tuple(ring_launches(geom, pos, src, pair, scale, heads, head_dim))


def accumulators(xp: Any, n: int, heads: int, dv: int, dtype: Any, out_dtype: Any = None) -> tuple[Array, Array]:
    """Running output zeros (n, H, Dv) and log-sum-exp -inf (n, H): both in the accumulator dtype of ``dtype``
    (float32 for float32), or, with ``out_dtype`` (the 16-bit kernels), the output in it and a float32 one."""
    acc = np.result_type(dtype, np.float32)
    out_dtype, lse_dtype = (acc, acc) if out_dtype is None else (out_dtype, np.float32)
    return xp.zeros((n, heads, dv), dtype=out_dtype), xp.full((n, heads), -np.inf, dtype=lse_dtype)


class FusedKernels:
    """Local patterns and ring blocks for one kernel launcher (the provider the ring takes as ``kernels``).

    ``out_dtype``: dtype of the running output the ring allocates, with a float32
    log-sum-exp (the 16-bit kernels); None: both in the accumulator dtype of the
    inputs (float32 for float32).
    """

    def __init__(self, launch: Launcher, check: Callable[..., None] | None = None, out_dtype: Any = None) -> None:
        self.launch = launch
        self.check = check
        self.out_dtype = out_dtype

    def accumulators(self, xp: Any, n: int, heads: int, dv: int, dtype: Any) -> tuple[Array, Array]:
        """Running output zeros (n, H, Dv) and log-sum-exp -inf (n, H) for this launcher."""
        return accumulators(xp, n, heads, dv, dtype, self.out_dtype)

    def local_patterns(self, qs: Array, ks: Array, vs: Array, patterns: Sequence[Any], causal: bool,
                       scale: float, out: Array, lse: Array, shape: Sequence[int] | None = None) -> None:
        """Patterns (``Pattern`` or ``(segment, dilation)``) whose segments lie inside these (n, H, D)
        arrays, merged into ``out``/``lse``. ``shape`` is read from ``qs`` unless given (raw pointers)."""
        if self.check is not None:
            self.check(qs, ks, vs, out, lse)
        n, heads, d = (int(x) for x in (qs.shape if shape is None else shape))
        for geometry in local_launches(patterns, causal, scale, n, heads, d):
            self.launch(qs, ks, vs, out, lse, **geometry)

    def ring_block(self, qs: Array, block: Array, geom: Any, pos: int, src: int, pair: Any, scale: float,
                   out: Array, lse: Array) -> None:
        """Attend this rank's selected queries of piece ``pair.query`` to piece ``pair.key`` of a packed ring block
        from ring position ``src`` (``distributed.ring.RingPattern``, ``PiecePair``); merge in place."""
        n, heads, d = (int(x) for x in qs.shape)
        for geometry in hop_launches(geom, pos, src, pair, float(scale), heads, d):
            self.launch(qs, block, block, out, lse, **geometry)

    def gathered(self, qs: Array, sequence: Array, gather: Any, scale: float, out: Array, lse: Array) -> None:
        """This rank's selected queries against a gathered pattern's rows in sequence order
        (``distributed.gather.GatherPattern``): one launch per query piece and head offset; merge in place."""
        n, heads, d = qs.shape
        for geometry in gather.launches(scale, heads, d):
            self.launch(qs, sequence, sequence, out, lse, **geometry)
