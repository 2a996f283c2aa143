"""Float64 dense reference built from a mask with multiplicities (test code only).

M[s, t] = number of patterns that select both s and t inside one segment (and
t <= s if causal); the output is one softmax over that multiset, computed
densely, O(N^2) per head. Independent of every implementation in the package.
"""

from __future__ import annotations

import numpy as np


def multiplicity_mask(n: int, head: int, patterns, causal: bool) -> np.ndarray:
    """M[s, t] for serialized positions s (queries) and t (keys) of one head."""
    s = np.arange(n)
    mask = np.zeros((n, n))
    for w, r in patterns:
        o = head % r
        seg = s // w
        selected = (s - seg * w) % r == o
        both = selected[:, None] & selected[None, :] & (seg[:, None] == seg[None, :])
        if causal:
            both &= s[None, :] <= s[:, None]
        mask += both
    return mask


def dense_dilated_attention(q, k, v, patterns, causal=False, perm=None, scale=None) -> np.ndarray:
    """Reference output (N, H, Dv) in natural order for natural-order q, k, v (N, H, D)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    n, heads, d = q.shape
    perm = np.arange(n) if perm is None else np.asarray(perm)
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    qs, ks, vs = q[perm], k[perm], v[perm]
    out_s = np.zeros((n, heads, v.shape[-1]))
    for h in range(heads):
        mult = multiplicity_mask(n, h, patterns, causal)
        scores = qs[:, h] @ ks[:, h].T * scale
        live = mult > 0
        mx = np.where(live, scores, -np.inf).max(axis=1, keepdims=True)
        mx = np.where(np.isfinite(mx), mx, 0.0)
        weights = mult * np.exp(np.where(live, scores - mx, -np.inf))
        den = weights.sum(axis=1, keepdims=True)
        out_s[:, h] = np.where(den > 0, weights @ vs[:, h] / np.where(den > 0, den, 1), 0.0)
    out = np.empty_like(out_s)
    out[perm] = out_s
    return out
