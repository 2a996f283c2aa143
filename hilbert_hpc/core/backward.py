"""Exact backward of dilated attention, blockwise (NumPy or CuPy), from the output and its merged log-sum-exp.

docs/semantics.md, section 10: the merged output is one softmax over the
multiset union of the patterns' key sets, so with the merged log-sum-exp ``L``
each pattern's probabilities are ``P = exp(S - L)`` and the gradients are sums
over patterns of the usual flash-attention terms. Nothing larger than a score
tile (``hilbert_hpc.core.blockwise.tile_shape``) is ever held: no N x N array
and no per-pattern copy of the outputs (only the inputs of one pattern and head
offset are gathered, as the forward does).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from hilbert_hpc.core.blockwise import (GPU_SCORE_TILE_ELEMENTS, SCORE_TILE_ELEMENTS, accumulator_dtype, array_module,
                                        tile_shape)
from hilbert_hpc.core.dilated import offset_groups, segment_view
from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.core.threads import cpu_threads, run_parallel

Grads = tuple[np.ndarray, np.ndarray, np.ndarray]


def attend_backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, lse: np.ndarray, delta: np.ndarray,
                    dout: np.ndarray, scale: float, causal_shift: int | None = None,
                    tile_elements: int | None = None) -> Grads:
    """Gradients (dq, dk, dv) of softmax attention whose probabilities are ``exp(scale q k^T - lse)``.

    Shapes as in :func:`hilbert_hpc.core.blockwise.attend`: ``q`` (..., M, D),
    ``k`` (..., Nk, D), ``v`` (..., Nk, Dv), ``lse`` and ``delta`` (..., M),
    ``dout`` (..., M, Dv), identical leading (batch) dimensions. ``lse`` is the
    merged log-sum-exp of each query over all its keys (not only these), and
    ``delta = rowsum(dout * out)`` with the merged output; the results are this
    block's terms of the gradients, in the accumulator dtype. ``causal_shift``:
    query ``i`` sees key ``j`` only if ``j <= i + causal_shift``. Score tiles hold
    at most ``tile_elements`` entries. NumPy or CuPy arrays (all of one kind): on the
    CPU independent batch chunks run on :func:`~hilbert_hpc.core.threads.cpu_threads`
    threads; each chunk owns its rows of dq, dk and dv and sums its tiles in a fixed
    order (no races, no locks).
    """
    xp = array_module(q)
    if tile_elements is None:
        tile_elements = SCORE_TILE_ELEMENTS if xp is np else GPU_SCORE_TILE_ELEMENTS
    acc = accumulator_dtype(q.dtype)
    *batch, M, D = q.shape
    Nk, Dv = k.shape[-2], v.shape[-1]
    nb = math.prod(batch)
    q3, k3, v3, do3 = (xp.asarray(x, dtype=acc).reshape(nb, x.shape[-2], x.shape[-1]) for x in (q, k, v, dout))
    lse2, delta2 = (xp.asarray(x, dtype=acc).reshape(nb, M) for x in (lse, delta))
    dq = xp.zeros((nb, M, D), dtype=acc)
    dk = xp.zeros((nb, Nk, D), dtype=acc)
    dv = xp.zeros((nb, Nk, Dv), dtype=acc)
    shapes = (dq.reshape(*batch, M, D), dk.reshape(*batch, Nk, D), dv.reshape(*batch, Nk, Dv))
    if M == 0 or Nk == 0 or nb == 0:
        return shapes
    tb, tq, tk = tile_shape(nb, M, Nk, tile_elements)
    if xp is np:
        tb = min(tb, -(-nb // cpu_threads()))    # at least one chunk per thread when the batch allows it
    scale = acc.type(scale)

    def chunk(b0: int, b1: int) -> None:
        for j0 in range(0, Nk, tk):
            j1 = min(Nk, j0 + tk)
            kt, vt = k3[b0:b1, j0:j1], v3[b0:b1, j0:j1]
            for i0 in range(0, M, tq):
                i1 = min(M, i0 + tq)
                if causal_shift is not None and i1 - 1 + causal_shift < j0:
                    continue
                s = xp.matmul(q3[b0:b1, i0:i1] * scale, kt.swapaxes(-1, -2))
                s -= lse2[b0:b1, i0:i1, None]
                p = xp.exp(s, out=s)
                if causal_shift is not None and j1 - 1 > i0 + causal_shift:
                    rows = xp.arange(i0, i1)[:, None] + causal_shift
                    p = xp.where(xp.arange(j0, j1)[None, :] > rows, 0, p)
                dot = do3[b0:b1, i0:i1]
                dv[b0:b1, j0:j1] += xp.matmul(p.swapaxes(-1, -2), dot)
                dp = xp.matmul(dot, vt.swapaxes(-1, -2))
                dp -= delta2[b0:b1, i0:i1, None]
                ds = xp.multiply(p, dp, out=p)
                dq[b0:b1, i0:i1] += xp.matmul(ds, kt)
                dk[b0:b1, j0:j1] += xp.matmul(ds.swapaxes(-1, -2), q3[b0:b1, i0:i1])
        dq[b0:b1] *= scale
        dk[b0:b1] *= scale

    chunks = [(b0, min(nb, b0 + tb)) for b0 in range(0, nb, tb)]
    if xp is np:
        run_parallel(chunk, chunks)
    else:
        for c in chunks:
            chunk(*c)
    return shapes


def _gathered(view: np.ndarray, offset: int, heads: slice) -> np.ndarray:
    """The rows of one head offset of a segment view, as (segments, heads in group, selected, ...)."""
    xp = array_module(view)
    return xp.ascontiguousarray(xp.moveaxis(view[:, :, offset, heads], 1, 2))


def row_delta(dout: np.ndarray, out: np.ndarray, acc: np.dtype) -> np.ndarray:
    """``delta = rowsum(dout * out)`` of (N, H, Dv) arrays, (N, H) in dtype ``acc`` (NumPy or CuPy)."""
    xp = array_module(dout)
    return xp.einsum("nhd,nhd->nh", xp.asarray(dout, dtype=acc), xp.asarray(out, dtype=acc))


def local_dilated_backward(qs: np.ndarray, ks: np.ndarray, vs: np.ndarray, out: np.ndarray, lse: np.ndarray,
                           dout: np.ndarray, patterns: Sequence[Pattern], causal: bool, scale: float,
                           delta: np.ndarray | None = None) -> Grads:
    """Gradients (dQ, dK, dV) of serialized dilated attention (docs/semantics.md, section 10).

    ``qs``, ``ks``, ``vs``: the serialized (N, H, D) inputs; ``out`` (N, H, Dv)
    and ``lse`` (N, H): the merged output and log-sum-exp of
    :func:`hilbert_hpc.core.dilated.local_dilated_forward`; ``dout``: the
    gradient of the output, serialized like it. Returns serialized gradients in
    the accumulator dtype; a (row, head) that no pattern selects gets zero. NumPy
    or CuPy arrays (the results are of the same kind). ``delta``: :func:`row_delta`
    of ``dout`` and ``out`` in the accumulator dtype, where the caller has it already.
    """
    xp = array_module(qs)
    acc = accumulator_dtype(qs.dtype)
    n, heads, d = qs.shape
    delta = row_delta(dout, out, acc) if delta is None else delta
    dq, dk = xp.zeros((n, heads, d), dtype=acc), xp.zeros((n, heads, d), dtype=acc)
    dv = xp.zeros((n, heads, vs.shape[-1]), dtype=acc)
    for p in patterns:
        views = [segment_view(x, p) for x in (qs, ks, vs, lse, delta, dout)]
        grads = [segment_view(x, p) for x in (dq, dk, dv)]
        for o, hs in offset_groups(p, heads):
            parts = attend_backward(*(_gathered(x, o, hs) for x in views), scale, 0 if causal else None)
            for grad, part in zip(grads, parts):
                grad[:, :, o, hs] += xp.moveaxis(part, 2, 1)
    return dq, dk, dv
