"""Float64 gradients of sampled rows, straight from the definition (docs/semantics.md, section 10).

The study checks every forward+backward case on sampled rows, as it checks the
forward (``core.reference``), without the whole sequence on one rank:

- dQ of a sampled row needs its own keys, its merged log-sum-exp ``L`` and
  ``D = rowsum(dO * O)``;
- dK and dV of a sampled row (as a key) need every query that attends to it,
  with each such query's ``L`` and ``D``, which need that query's own keys.

So the reference first computes the merged output and ``L`` of the *stat rows*
(the sampled rows and the queries of every block that one of them is a key of),
then the three gradients of the sampled rows. The work is bounded by those
blocks (a few thousand queries a sampled row for LongNet patterns), never the
whole sequence, and every input row is made by ``source`` where it is needed
(counter-based random rows, or rows read from the input file).

Rows are serialized positions. ``source(name, positions)`` returns the rows
(n, H, D) of ``"q"``, ``"k"``, ``"v"`` or ``"do"`` as float64 arrays of ``xp``
(NumPy, or CuPy for a GPU backend: the same code, far faster there).

:func:`reference_gradient_check` also gives the size of each gradient's terms
(docs/semantics.md, section 10): every element of a gradient is a sum of terms,
``dV = sum Pr dO`` and, with ``dS = Pr (dP - Delta)`` split into its two parts,
``dQ = scale sum (Pr dP K - Pr Delta K)`` and ``dK = scale sum (Pr dP Q - Pr Delta Q)``;
their root-sum-square is what a computed gradient's rounding is measured against
where the exact gradient cancels to (near) zero.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import numpy as np

from hilbert_hpc.core.patterns import Pattern

Source = Callable[[str, np.ndarray], Any]

#: float64 score entries of one chunk of rows (bounds the reference's temporaries: 128 MiB each)
SCORE_ELEMENTS = 1 << 24
#: key rows gathered for one chunk of rows
KEY_ROWS = 1 << 16


def reference_gradient_rows(rows: np.ndarray, *, source: Source, heads: int, patterns: Sequence[Pattern],
                            causal: bool, scale: float, xp: Any = np) -> tuple[Any, Any, Any]:
    """Exact dQ, dK, dV rows (len(rows), H, D) in float64 (arrays of ``xp``) for sorted, distinct serialized
    positions ``rows``, with the loss gradient dO that ``source("do", ...)`` gives."""
    return _checked(rows, source, heads, patterns, causal, scale, xp, False)[0]


def reference_gradient_check(rows: np.ndarray, *, source: Source, heads: int, patterns: Sequence[Pattern],
                             causal: bool, scale: float, xp: Any = np) -> tuple[tuple[Any, Any, Any],
                                                                                tuple[Any, Any, Any]]:
    """(dQ, dK, dV) as :func:`reference_gradient_rows` gives them, and the root-sum-square of each gradient
    element's terms (same shapes): ``sqrt(sum Pr^2 dO^2)`` for dV, ``scale sqrt(sum Pr^2 (dP^2 + Delta^2) K^2)``
    for dQ and the same with Q for dK (docs/semantics.md, section 10). It is 0 only where every term is."""
    return _checked(rows, source, heads, patterns, causal, scale, xp, True)


def _checked(rows: np.ndarray, source: Source, heads: int, patterns: Sequence[Pattern], causal: bool,
             scale: float, xp: Any, terms: bool) -> tuple[tuple[Any, Any, Any], tuple[Any, Any, Any] | None]:
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size and np.any(np.diff(rows) <= 0):
        raise ValueError("rows must be sorted and distinct")
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):   # only padding rows meet inf - inf
        return _gradients(rows, source, heads, patterns, causal, scale, xp, terms)


def _gradients(rows: np.ndarray, source: Source, heads: int, patterns: Sequence[Pattern], causal: bool,
               scale: float, xp: Any, terms: bool) -> tuple[tuple[Any, Any, Any], tuple[Any, Any, Any] | None]:
    """The gradients of ``rows`` and, with ``terms``, the root-sum-square of their terms (else None)."""
    blocks = list(_key_blocks(rows, patterns, heads, causal))
    stat_rows = np.unique(np.concatenate([rows, *(queries for _, _, queries in blocks)]))
    q, do = source("q", stat_rows), source("do", stat_rows)
    out, lse = _forward_stats(stat_rows, q, source, heads, patterns, causal, scale, xp)
    delta = (do * out).sum(axis=-1)
    del out
    at = xp.asarray(np.searchsorted(stat_rows, rows))
    dq, sq = _query_gradients(rows, q[at], do[at], lse[at], delta[at], source, heads, patterns, causal, scale, xp,
                              terms)
    dk, dv, sk, sv = _key_gradients(rows, stat_rows, q, do, lse, delta, blocks, source, scale, xp, terms)
    return (dq, dk, dv), ((xp.sqrt(sq), xp.sqrt(sk), xp.sqrt(sv)) if terms else None)


def _key_blocks(rows: np.ndarray, patterns: Sequence[Pattern], heads: int,
                causal: bool) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(index into ``rows``, heads, queries) for every pattern that selects a row as a key: the heads
    ``h = row (mod r)`` and the selected rows of its segment that attend to it (those at or after it, if
    causal)."""
    for i, t in enumerate(rows.tolist()):
        for p in patterns:
            o = t % p.dilation
            if o >= heads:
                continue
            queries = t // p.segment * p.segment + o + p.dilation * np.arange(p.selected, dtype=np.int64)
            if causal:
                queries = queries[queries >= t]
            yield i, np.arange(o, heads, p.dilation), queries


def _segment_chunks(rows: np.ndarray, p: Pattern, o: int, head_count: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The rows that ``p`` selects at offset ``o``, grouped by segment, in chunks: (index (U, c) into ``rows``,
    -1 padding; keys (U, m), the serialized positions of each group's segment keys). A segment's rows are
    split into groups of bounded size; groups of alike sizes share a chunk, within the score budget."""
    w, r, m = p.segment, p.dilation, p.selected
    sel = np.flatnonzero(rows % r == o)
    if not sel.size:
        return
    seg = rows[sel] // w
    starts = np.flatnonzero(np.r_[True, seg[1:] != seg[:-1]])
    ends = np.r_[starts[1:], sel.size]
    piece = max(1, SCORE_ELEMENTS // (m * head_count))
    groups = sorted(((a, min(a + piece, b)) for a, b in zip(starts.tolist(), ends.tolist())
                     for a in range(a, b, piece)), key=lambda g: g[1] - g[0])
    i = 0
    while i < len(groups):
        j = i + 1                                    # sizes ascend: the last group of a chunk is its largest
        while (j < len(groups) and (j + 1 - i) * (groups[j][1] - groups[j][0]) * m * head_count <= SCORE_ELEMENTS
               and (j + 1 - i) * m <= KEY_ROWS):
            j += 1
        chunk = groups[i:j]
        index = np.full((len(chunk), chunk[-1][1] - chunk[-1][0]), -1, dtype=np.int64)
        for u, (a, b) in enumerate(chunk):
            index[u, :b - a] = sel[a:b]
        first = rows[sel[[a for a, _ in chunk]]]
        yield index, (first // w * w + o)[:, None] + r * np.arange(m, dtype=np.int64)[None, :]
        i = j


class _SegmentRows:
    """K and V of a chunk's segment keys, kept for the next chunk: the pieces of one long segment come in
    consecutive chunks (``_segment_chunks`` sorts groups by size), which then make its rows once."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.keys: np.ndarray | None = None
        self.rows: tuple[Any, Any] = (None, None)

    def __call__(self, keys: np.ndarray) -> tuple[Any, Any]:
        if self.keys is None or not np.array_equal(self.keys, keys):
            self.keys, self.rows = keys, (self.source("k", keys.ravel()), self.source("v", keys.ravel()))
        return self.rows


class _Chunk:
    """One chunk of rows against their segments' keys, for the heads ``hs``: the rows' scores and the keys."""

    def __init__(self, rows: np.ndarray, index: np.ndarray, keys: np.ndarray, hs: np.ndarray,
                 segments: _SegmentRows, causal: bool, xp: Any) -> None:
        self.valid = index >= 0
        self.safe = np.where(self.valid, index, 0)
        self.hs = hs
        u, m = keys.shape
        k, v = segments(keys)
        # (U, hs, m, D): the segment keys of each group, head-major for batched products
        self.k = k[:, hs].reshape(u, m, len(hs), -1).transpose(0, 2, 1, 3)
        self.v = v[:, hs].reshape(u, m, len(hs), -1).transpose(0, 2, 1, 3)
        allowed = np.broadcast_to(self.valid[:, :, None], (*index.shape, m))
        if causal:
            allowed = allowed & (keys[:, None, :] <= rows[self.safe][:, :, None])
        self.allowed = xp.asarray(allowed)[:, None]             # (U, 1, c, m)

    def rows_of(self, x: Any, xp: Any) -> Any:
        """(U, c, hs, ...) of an array over the rows (padding: row 0)."""
        return x[xp.asarray(self.safe)][:, :, xp.asarray(self.hs)]

    def heads_first(self, x: Any, xp: Any) -> Any:
        """(U, hs, c, D) of an (n, H, D) array over the rows."""
        return self.rows_of(x, xp).transpose(0, 2, 1, 3)

    def scores(self, q: Any, scale: float, xp: Any) -> Any:
        """(U, hs, c, m) scaled scores, -inf where masked (causal, padding)."""
        s = xp.matmul(self.heads_first(q, xp), self.k.swapaxes(-1, -2)) * scale
        return xp.where(self.allowed, s, -xp.inf)

    def scatter(self, target: Any, values: Any, xp: Any, add: bool) -> None:
        """``target[row, hs] (+)= values`` (U, c, hs, ...) for the chunk's real rows."""
        where = xp.ix_(xp.asarray(self.safe[self.valid]), xp.asarray(self.hs))
        picked = values[xp.asarray(self.valid)]
        if add:
            target[where] += picked
        else:
            target[where] = picked


def _chunks(rows: np.ndarray, source: Source, heads: int, patterns: Sequence[Pattern], causal: bool,
            xp: Any) -> Iterator[_Chunk]:
    """Every chunk of ``rows`` against their segments' keys: per pattern and head offset, their heads."""
    segments = _SegmentRows(source)
    for p in patterns:
        for o in range(min(p.dilation, heads)):
            hs = np.arange(o, heads, p.dilation)
            for index, keys in _segment_chunks(rows, p, o, len(hs)):
                yield _Chunk(rows, index, keys, hs, segments, causal, xp)


def _forward_stats(rows: np.ndarray, q: Any, source: Source, heads: int, patterns: Sequence[Pattern],
                   causal: bool, scale: float, xp: Any) -> tuple[Any, Any]:
    """The merged output (n, H, D) and log-sum-exp (n, H) of ``rows`` (-inf and 0 where no pattern selects)."""
    out = xp.zeros((*q.shape[:2], source("v", rows[:1]).shape[-1]), dtype=np.float64)
    lse = xp.full(q.shape[:2], -np.inf)
    for c in _chunks(rows, source, heads, patterns, causal, xp):
        s = c.scores(q, scale, xp)
        mx = s.max(axis=-1, keepdims=True)
        mx = xp.where(xp.isfinite(mx), mx, 0.0)            # padding rows see no key
        e = xp.exp(s - mx)
        den = e.sum(axis=-1)
        part = (xp.matmul(e, c.v) / xp.maximum(den, 1e-300)[..., None]).transpose(0, 2, 1, 3)
        part_lse = (mx[..., 0] + xp.log(den)).transpose(0, 2, 1)        # (U, c, hs)
        a, b = c.rows_of(lse, xp), part_lse
        mm = xp.maximum(a, b)
        wa, wb = xp.exp(a - mm), xp.exp(b - mm)
        merged = (c.rows_of(out, xp) * wa[..., None] + part * wb[..., None]) / (wa + wb)[..., None]
        c.scatter(out, merged, xp, add=False)
        c.scatter(lse, mm + xp.log(wa + wb), xp, add=False)
    return out, lse


def _query_gradients(rows: np.ndarray, q: Any, do: Any, lse: Any, delta: Any, source: Source, heads: int,
                     patterns: Sequence[Pattern], causal: bool, scale: float, xp: Any,
                     terms: bool) -> tuple[Any, Any]:
    """dQ of ``rows``: scale * sum over their keys of P (dP - D) K; with ``terms``, the sum of its terms'
    squares (else None)."""
    dq = xp.zeros(q.shape, dtype=np.float64)
    sq = xp.zeros(q.shape, dtype=np.float64) if terms else None
    for c in _chunks(rows, source, heads, patterns, causal, xp):
        prob = xp.exp(c.scores(q, scale, xp) - c.rows_of(lse, xp).transpose(0, 2, 1)[..., None])
        dp = xp.matmul(c.heads_first(do, xp), c.v.swapaxes(-1, -2))
        d = c.rows_of(delta, xp).transpose(0, 2, 1)[..., None]
        ds = prob * (dp - d)
        c.scatter(dq, scale * xp.matmul(ds, c.k).transpose(0, 2, 1, 3), xp, add=True)
        if terms:
            del ds
            weight = _squared_parts(prob, dp, d)
            c.scatter(sq, scale ** 2 * xp.matmul(weight, c.k * c.k).transpose(0, 2, 1, 3), xp, add=True)
    return dq, sq


def _squared_parts(prob: Any, dp: Any, delta: Any) -> Any:
    """Pr^2 (dP^2 + Delta^2): the squares of dS = Pr (dP - Delta)'s two parts, in place of ``dp``."""
    dp *= dp
    dp += delta * delta
    dp *= prob * prob
    return dp


def _key_gradients(rows: np.ndarray, stat_rows: np.ndarray, q: Any, do: Any, lse: Any, delta: Any,
                   blocks: list, source: Source, scale: float, xp: Any, terms: bool) -> tuple[Any, Any, Any, Any]:
    """dK and dV of ``rows``: over the queries of every block each row is a key of (``_key_blocks``); with
    ``terms``, the sums of their terms' squares (else None)."""
    k, v = source("k", rows), source("v", rows)
    dk, dv = xp.zeros(k.shape, dtype=np.float64), xp.zeros(v.shape, dtype=np.float64)
    sk, sv = (xp.zeros(k.shape, dtype=np.float64), xp.zeros(v.shape, dtype=np.float64)) if terms else (None, None)
    for i, hs, queries in blocks:
        at, h = xp.asarray(np.searchsorted(stat_rows, queries)), xp.asarray(hs)
        qq, dd = q[at][:, h], do[at][:, h]                                  # (m, hs, D)
        prob = xp.exp(xp.einsum("mhd,hd->mh", qq, k[i, h]) * scale - lse[at][:, h])
        dv[i, h] += xp.einsum("mh,mhd->hd", prob, dd)
        dp, d = xp.einsum("mhd,hd->mh", dd, v[i, h]), delta[at][:, h]
        dk[i, h] += scale * xp.einsum("mh,mhd->hd", prob * (dp - d), qq)
        if terms:
            sv[i, h] += xp.einsum("mh,mhd->hd", prob * prob, dd * dd)
            sk[i, h] += scale ** 2 * xp.einsum("mh,mhd->hd", _squared_parts(prob, dp, d), qq * qq)
    return dk, dv, sk, sv


def reference_bytes(tokens: int, heads: int, head_dim: int, patterns: Sequence[Pattern], rows: int) -> int:
    """At most the bytes :func:`reference_gradient_check` holds for ``rows`` sampled rows: the stat rows' Q, dO,
    output, log-sum-exp and rowsum (the rows and the queries of their blocks), the three gradients and their
    terms' sums of squares, a chunk's score temporaries and its keys and values (made for every head, then one
    head group's copy, and the squares of its keys)."""
    row = heads * head_dim
    stat = min(tokens, rows * (1 + sum(p.selected for p in patterns)))
    keys = max(KEY_ROWS, max((p.selected for p in patterns), default=0))
    return 8 * (stat * (3 * row + 2 * heads) + 6 * rows * row + 4 * SCORE_ELEMENTS + 5 * keys * row)
