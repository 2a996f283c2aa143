"""Tiled attention with online softmax and log-sum-exp merges, for any NumPy-like array module.

These are the building blocks of the array-module backends (NumPy on the CPU,
CuPy on the GPU before the fused kernels take over): ``attend`` computes the
softmax attention of a block of queries against a block of keys, tile by tile,
never holding more than one score tile; ``merge_lse`` combines two partial results
by their log-sum-exp, so patterns and ring steps can be merged exactly.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from hilbert_hpc.core.threads import run_parallel

Array = Any

#: Maximum number of score elements held at once per CPU thread (cache-sized tiles).
SCORE_TILE_ELEMENTS = 1 << 18

#: Score elements per tile on a GPU: large tiles keep kernel launches few.
GPU_SCORE_TILE_ELEMENTS = 1 << 25

#: Keys per score tile: whole rows up to this length need no online rescaling.
KEY_TILE = 4096


def array_module(x: Array) -> ModuleType:
    """Return the array module (numpy or cupy) that owns ``x``."""
    mod = type(x).__module__.split(".")[0]
    if mod == "cupy":
        import cupy

        return cupy
    return np


def accumulator_dtype(dtype: np.dtype) -> np.dtype:
    """Softmax statistics and merges run in at least float32."""
    return np.result_type(dtype, np.float32)


def _safe_max(m: Array, xp: ModuleType) -> Array:
    """Replace -inf row maxima by 0 so that fully masked rows give exp(-inf) = 0, not NaN."""
    return xp.where(xp.isneginf(m), 0, m)


def tile_shape(batch: int, queries: int, keys: int, tile_elements: int) -> tuple[int, int, int]:
    """(batch entries, queries, keys) of one score tile of at most ``tile_elements`` entries (``keys`` > 0).

    Whole key rows up to ``KEY_TILE``; as many queries as fit, then as many batch entries.
    """
    tk = min(keys, KEY_TILE)
    tq = max(1, min(queries, tile_elements // tk))
    tb = max(1, min(batch, tile_elements // (tq * tk)))
    return tb, tq, tk


def attend(q: Array, k: Array, v: Array, scale: float, causal_shift: int | None = None,
           tile_elements: int | None = None) -> tuple[Array, Array]:
    """Softmax attention of ``q`` over ``k``/``v`` with its log-sum-exp.

    Shapes: ``q`` (..., M, D), ``k`` (..., Nk, D), ``v`` (..., Nk, Dv), identical
    leading (batch) dimensions. With ``causal_shift = c`` query ``i`` sees key ``j``
    only if ``j <= i + c`` (for a diagonal block ``c = 0``). Returns the normalized
    output (..., M, Dv) and the log-sum-exp (..., M) of the scaled scores in the
    accumulator dtype; rows that see no key get output 0 and log-sum-exp -inf.
    Score tiles hold at most ``tile_elements`` entries. On the CPU the independent
    (batch, query) tiles are spread over :func:`~hilbert_hpc.core.threads.cpu_threads` threads.
    """
    xp = array_module(q)
    if tile_elements is None:
        tile_elements = SCORE_TILE_ELEMENTS if xp is np else GPU_SCORE_TILE_ELEMENTS
    acc = accumulator_dtype(q.dtype)
    *batch, M, D = q.shape
    Nk = k.shape[-2]
    Dv = v.shape[-1]
    nb = int(np.prod(batch, dtype=np.int64)) if batch else 1
    q3 = q.reshape(nb, M, D)
    k3 = k.reshape(nb, Nk, D)
    v3 = v.reshape(nb, Nk, Dv)
    out = xp.zeros((nb, M, Dv), dtype=acc)
    lse = xp.full((nb, M), -np.inf, dtype=acc)
    if M == 0 or Nk == 0:
        return out.reshape(*batch, M, Dv), lse.reshape(*batch, M)

    tb, tq, tk = tile_shape(nb, M, Nk, tile_elements)
    scale = q.dtype.type(scale)

    def tile(b0: int, b1: int, i0: int, i1: int) -> None:
        j_end = Nk if causal_shift is None else max(0, min(Nk, i1 + causal_shift))
        if j_end == 0:
            return
        qt = q3[b0:b1, i0:i1] * scale
        m_run = xp.full((b1 - b0, i1 - i0), -np.inf, dtype=acc)
        l_run = xp.zeros((b1 - b0, i1 - i0), dtype=acc)
        o_run = None
        for j0 in range(0, j_end, tk):
            j1 = min(j_end, j0 + tk)
            s = xp.matmul(qt, k3[b0:b1, j0:j1].swapaxes(-1, -2))
            if s.dtype != acc:
                s = s.astype(acc)
            if causal_shift is not None and j1 - 1 > i0 + causal_shift:
                rows = xp.arange(i0, i1)[:, None] + causal_shift
                cols = xp.arange(j0, j1)[None, :]
                s = xp.where(cols > rows, -np.inf, s)
            m_new = xp.maximum(m_run, s.max(axis=-1))
            m_safe = _safe_max(m_new, xp)
            s -= m_safe[..., None]
            p = xp.exp(s, out=s)
            pv = xp.matmul(p.astype(v.dtype, copy=False), v3[b0:b1, j0:j1]).astype(acc, copy=False)
            if o_run is None:
                l_run = p.sum(axis=-1)
                o_run = pv
            else:
                alpha = xp.exp(m_run - m_safe)
                l_run = l_run * alpha + p.sum(axis=-1)
                o_run *= alpha[..., None]
                o_run += pv
            m_run = m_new
        seen = l_run > 0
        out[b0:b1, i0:i1] = o_run / xp.where(seen, l_run, 1)[..., None]
        lse[b0:b1, i0:i1] = xp.where(seen, _safe_max(m_run, xp) + xp.log(xp.where(seen, l_run, 1)), -np.inf)

    tiles = [(b0, min(nb, b0 + tb), i0, min(M, i0 + tq)) for b0 in range(0, nb, tb) for i0 in range(0, M, tq)]
    if xp is np:
        run_parallel(tile, tiles)
    else:
        for t in tiles:
            tile(*t)
    return out.reshape(*batch, M, Dv), lse.reshape(*batch, M)


def merge_lse(out_a: Array, lse_a: Array, out_b: Array, lse_b: Array) -> None:
    """Merge partial result ``b`` into ``a`` in place by log-sum-exp.

    ``out_a`` (..., Dv) and ``lse_a`` (...) may be strided views into larger
    arrays; afterwards they hold the softmax over the union of both key sets.
    Uses max-subtraction, so no exponent ever overflows; rows where both sides
    are empty stay 0 / -inf.
    """
    xp = array_module(out_a)
    m = xp.maximum(lse_a, lse_b)
    m_safe = _safe_max(m, xp)
    wa = xp.exp(lse_a - m_safe)
    wb = xp.exp(lse_b - m_safe)
    den = wa + wb
    nz = den > 0
    inv = 1 / xp.where(nz, den, 1)
    out_a[...] = out_a * (wa * inv)[..., None] + out_b * (wb * inv)[..., None]
    lse_a[...] = xp.where(nz, m_safe + xp.log(xp.where(nz, den, 1)), -np.inf)
