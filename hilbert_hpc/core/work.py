"""Useful work per rank: the attended pairs and useful FLOPs of the queries each rank owns, and imbalance.

The counting is :func:`hilbert_hpc.core.patterns.attended_pairs`'s, split by
query position: pattern ``(w, r)`` selects, for head offset ``o = h mod r``,
positions ``s*w + o + j*r`` (``j < m = w / r``) of segment ``s``; query ``j``
attends ``j + 1`` keys under the causal mask (on the serialized order), ``m``
without. The queries of serialized positions ``[start, stop)`` are counted in
closed form, so a rank's count costs O(patterns x min(heads, r)) whatever the
sequence length.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from hilbert_hpc.core.patterns import Pattern


def _pairs_before(x: int, pattern: Pattern, offset: int, causal: bool) -> int:
    """Attended pairs of one head of offset ``offset`` whose query lies at a serialized position ``< x``."""
    w, r, m = pattern.segment, pattern.dilation, pattern.selected
    per_segment = m * (m + 1) // 2 if causal else m * m
    inside = x % w
    n = min(m, max(0, -(-(inside - offset) // r)))     # selected queries of the last, partial segment
    return (x // w) * per_segment + (n * (n + 1) // 2 if causal else n * m)


def span_pairs(start: int, stop: int, heads: int, patterns: Sequence[Pattern], causal: bool) -> int:
    """(query, key, head) score entries of the queries at serialized positions ``[start, stop)``."""
    if not 0 <= start <= stop:
        raise ValueError(f"span [{start}, {stop}) must satisfy 0 <= start <= stop")
    total = 0
    for p in patterns:
        for offset in range(min(heads, p.dilation)):
            with_offset = -(-(heads - offset) // p.dilation)     # heads h < heads with h mod r == offset
            total += with_offset * (_pairs_before(stop, p, offset, causal) - _pairs_before(start, p, offset, causal))
    return total


#: how serialized positions are assigned to ranks (``distributed.sharding.Shards``)
PLACEMENTS = ("contiguous", "zigzag")


def spans_of(tokens: int, ranks: int, placement: str, rank: int) -> list[tuple[int, int]]:
    """The serialized spans ``[start, stop)`` rank ``rank`` holds, in the order of its local rows:
    ``contiguous``, ``[p*L, (p+1)*L)``, ``L = N / P``; ``zigzag``, chunks ``p`` and ``2P-1-p`` of ``2P`` equal
    chunks."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    pieces = ranks if placement == "contiguous" else 2 * ranks
    if ranks < 1 or tokens % pieces:
        raise ValueError(f"ranks must be a positive number of ranks whose {pieces // ranks} chunk(s) each divide "
                         f"tokens ({tokens}), got {ranks}")
    c = tokens // pieces
    if placement == "contiguous":
        return [(rank * c, (rank + 1) * c)]
    return [(rank * c, (rank + 1) * c), ((2 * ranks - 1 - rank) * c, (2 * ranks - rank) * c)]


def rank_spans(tokens: int, ranks: int, placement: str = "contiguous") -> list[list[tuple[int, int]]]:
    """:func:`spans_of` every rank."""
    return [spans_of(tokens, ranks, placement, p) for p in range(ranks)]


def rank_useful_flops(tokens: int, ranks: int, heads: int, head_dim: int, patterns: Sequence[Pattern],
                      causal: bool, batch: int = 1, placement: str = "contiguous") -> list[int]:
    """Useful FLOPs of the forward (4 D per attended pair, as :func:`hilbert_hpc.core.patterns.useful_flops`)
    of the queries each rank owns (:func:`rank_spans` of ``placement``); they sum to the whole problem's. The
    backward's are ``BACKWARD_FLOPS`` times these."""
    return [4 * head_dim * batch * sum(span_pairs(a, b, heads, patterns, causal) for a, b in spans)
            for spans in rank_spans(tokens, ranks, placement)]


def imbalance(per_rank: np.ndarray | Sequence[float]) -> float:
    """Load imbalance, largest over mean across ranks (axis 0); of an array (ranks, repeats), the median over
    repeats. 1.0 is perfect balance; NaN when the mean is not positive."""
    a = np.asarray(per_rank, dtype=np.float64)
    a = a.reshape(a.shape[0], -1) if a.ndim else a.reshape(1, 1)
    if a.size == 0:
        return float("nan")
    mean = a.mean(axis=0)
    ratios = np.where(mean > 0, a.max(axis=0) / np.where(mean > 0, mean, 1.0), np.nan)
    return float(np.median(ratios))
