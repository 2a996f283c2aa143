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


def dense_dilated_attention_torch(q, k, v, patterns, causal=False, perm=None, scale=None):
    """The same reference as torch operations on natural-order (N, H, D) tensors, differentiable by autograd.

    Each (query, key) logit is ``S + log M`` over the keys with ``M > 0``; rows with no key give 0.
    """
    import torch

    n, heads, d = q.shape
    perm = torch.arange(n) if perm is None else torch.tensor(np.asarray(perm))
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    qs, ks, vs = q[perm], k[perm], v[perm]
    heads_out = []
    for h in range(heads):
        mult = torch.as_tensor(multiplicity_mask(n, h, patterns, causal), dtype=q.dtype)
        live = mult > 0
        logits = torch.where(live, qs[:, h] @ ks[:, h].T * scale + torch.log(torch.where(live, mult, 1)), -torch.inf)
        any_key = live.any(dim=1, keepdim=True)
        weights = torch.softmax(torch.where(any_key, logits, 0.0), dim=1) * any_key
        heads_out.append(weights @ vs[:, h])
    out_s = torch.stack(heads_out, dim=1)
    return out_s[torch.as_tensor(np.argsort(np.asarray(perm)))]
