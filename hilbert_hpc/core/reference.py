"""Float64 reference for sampled output rows, straight from the definition (docs/semantics.md, sections 2-6).

Used to report the accuracy of every timed case: for each sampled natural row it
gathers, per pattern and head, the keys of the row's segment, takes the
softmax in float64 and merges patterns by log-sum-exp.

The rows are sampled among those some pattern selects (``sample_selected_rows``):
a row no pattern selects for any head has output 0 and reference 0, so with
sparse patterns uniform sampling would mostly check nothing.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from hilbert_hpc.core.patterns import Pattern

RowSource = Callable[[str, np.ndarray], np.ndarray]

#: Keys gathered at once per chunk of sampled rows (bounds the reference's memory).
KEYS_PER_CHUNK = 1 << 14
#: Up to this many (pattern, selected row) entries the selected rows are listed outright; above it they are drawn.
LIST_SELECTED = 1 << 16


def selected_heads(serial: np.ndarray, heads: int, patterns: Sequence[Pattern]) -> np.ndarray:
    """(len(serial), heads) booleans: True where some pattern selects serialized row ``s`` for head ``h``.

    Pattern ``(w, r)`` selects row ``s`` for the heads ``h`` with ``h = s (mod r)``
    (``r`` divides ``w``, so the position inside the segment has the same residue).
    """
    s = np.asarray(serial, dtype=np.int64)[:, None]
    h = np.arange(heads, dtype=np.int64)[None, :]
    selected = np.zeros((s.shape[0], heads), dtype=bool)
    for p in patterns:
        selected |= (s % p.dilation) == (h % p.dilation)
    return selected


def sample_selected_rows(tokens: int, heads: int, patterns: Sequence[Pattern], rows: int, seed: int) -> np.ndarray:
    """``min(rows, S)`` distinct serialized positions drawn uniformly among the ``S`` rows some pattern selects.

    A row ``s`` is selected when ``s mod r < min(r, heads)`` for some pattern's
    dilation ``r``. The draw depends only on its arguments (never on the rank
    count) and costs O(rows) beyond a bounded listing: when the patterns'
    selections hold few entries they are listed and sampled without replacement;
    otherwise each draw picks a (pattern, selected index) entry uniformly and keeps
    it only when that pattern is the first to select the row, which is uniform
    over the union (every pattern selects at least ``tokens / r`` rows, so at least
    one draw in ``len(patterns)`` is kept on average). Sorted.
    """
    r = np.array([p.dilation for p in patterns], dtype=np.int64)
    k = np.minimum(r, heads)
    counts = tokens // r * k
    total = int(counts.sum())
    rng = np.random.default_rng(seed)
    if rows <= 0 or total == 0:
        return np.empty(0, dtype=np.int64)
    if total <= max(LIST_SELECTED, 8 * rows * len(patterns)):
        every = np.unique(np.concatenate([_nth_selected(np.arange(c, dtype=np.int64), rp, kp)
                                          for c, rp, kp in zip(counts, r, k)]))
        return np.sort(rng.choice(every, min(rows, every.size), replace=False))
    # here the union holds more than 8 * rows rows: distinct draws come quickly
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    found = np.empty(0, dtype=np.int64)
    while found.size < rows:
        j = rng.integers(0, total, max(64, 2 * rows * len(patterns)), dtype=np.int64)
        p = np.searchsorted(starts, j, side="right") - 1
        s = _nth_selected(j - starts[p], r[p], k[p])
        first = np.argmax((s[None, :] % r[:, None]) < k[:, None], axis=0)
        found = np.concatenate([found, s[first == p]])
        _, keep = np.unique(found, return_index=True)
        found = found[np.sort(keep)]                    # distinct, in the order drawn
    return np.sort(found[:rows])


def selected_row_count(tokens: int, heads: int, patterns: Sequence[Pattern], at_most: int) -> int:
    """``min(at_most, S)``, ``S`` the rows some pattern selects: how many rows ``sample_selected_rows`` returns."""
    if any(p.dilation <= heads for p in patterns):       # such a pattern selects every row
        return min(at_most, tokens)
    return int(sample_selected_rows(tokens, heads, patterns, at_most, 0).size)


def _nth_selected(j: np.ndarray, r: np.ndarray | int, k: np.ndarray | int) -> np.ndarray:
    """Serialized position of the ``j``-th row selected by a dilation ``r`` whose first ``k`` residues are used."""
    return j // k * r + j % k


def reference_rows(rows: np.ndarray, *, source: RowSource, perm: np.ndarray, inverse: np.ndarray,
                   heads: int, patterns: Sequence[Pattern], causal: bool, scale: float) -> np.ndarray:
    """Exact output rows (len(rows), H, Dv) in float64 for natural positions ``rows``.

    ``source(name, natural_idx)`` returns rows of ``"q"``, ``"k"`` or ``"v"`` (n, H, D);
    ``perm``/``inverse`` are the serialization permutation and its inverse.
    """
    rows = np.asarray(rows, dtype=np.int64)
    s = inverse[rows]
    q = source("q", rows).astype(np.float64)
    dv = source("v", rows[:1]).shape[-1]
    out = np.zeros((len(rows), heads, dv))
    lse = np.full((len(rows), heads), -np.inf)
    for p in patterns:
        w, r, m = p.segment, p.dilation, p.selected
        for o in range(min(r, heads)):
            hs = np.arange(o, heads, r)
            sel_all = np.nonzero(s % r == o)[0]
            chunk = max(1, KEYS_PER_CHUNK // m)
            for c0 in range(0, sel_all.size, chunk):
                sel = sel_all[c0:c0 + chunk]
                keys_s = (s[sel] // w * w + o)[:, None] + r * np.arange(m)[None, :]
                # sampled rows of one segment share its keys: each distinct key row is made once
                nat, where = np.unique(perm[keys_s].ravel(), return_inverse=True)
                kk = source("k", nat)[:, hs].astype(np.float64)[where].reshape(len(sel), m, len(hs), -1)
                vv = source("v", nat)[:, hs].astype(np.float64)[where].reshape(len(sel), m, len(hs), -1)
                scores = np.einsum("nhd,nmhd->nhm", q[sel][:, hs], kk) * scale
                if causal:
                    scores = np.where((keys_s <= s[sel][:, None])[:, None, :], scores, -np.inf)
                mx = scores.max(axis=2, keepdims=True)
                e = np.exp(scores - mx)
                den = e.sum(axis=2)
                part = np.einsum("nhm,nmhd->nhd", e, vv) / den[..., None]
                part_lse = mx[..., 0] + np.log(den)
                a = lse[np.ix_(sel, hs)]
                mm = np.maximum(a, part_lse)
                wa, wb = np.exp(a - mm), np.exp(part_lse - mm)
                prev = out[np.ix_(sel, hs)]
                out[np.ix_(sel, hs)] = (prev * wa[..., None] + part * wb[..., None]) / (wa + wb)[..., None]
                lse[np.ix_(sel, hs)] = mm + np.log(wa + wb)
    return out
