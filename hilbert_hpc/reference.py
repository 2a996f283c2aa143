"""Float64 reference for sampled output rows, straight from the definition (DESIGN section 2).

Used to report the accuracy of every timed case: for each sampled natural row it
gathers, per pattern and head, the keys of the row's segment, takes the
softmax in float64 and merges patterns by log-sum-exp.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .patterns import Pattern

RowSource = Callable[[str, np.ndarray], np.ndarray]

#: Keys gathered at once per chunk of sampled rows (bounds the reference's memory).
KEYS_PER_CHUNK = 1 << 14


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
