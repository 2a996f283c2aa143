"""The exact CPU backward (hilbert_hpc.core.backward) against autograd of the float64 dense reference."""

from __future__ import annotations

import numpy as np
import pytest

from dense_reference import dense_dilated_attention_torch
from hilbert_hpc.core.backward import attend_backward, local_dilated_backward
from hilbert_hpc.core.blockwise import attend
from hilbert_hpc.core.dilated import local_dilated_forward
from hilbert_hpc.core.patterns import Pattern

torch = pytest.importorskip("torch")

#: (n, heads, head_dim, patterns, causal): overlapping patterns, dilations that skip heads, D not a power of 2
CASES = [
    (48, 3, 5, [(12, 1), (24, 2), (48, 4)], False),
    (48, 3, 5, [(12, 1), (24, 2), (48, 4)], True),
    (64, 5, 6, [(16, 2), (16, 2), (64, 8)], True),     # one pattern twice: every key counts twice
    (60, 2, 7, [(20, 5), (30, 3)], False),            # dilation 5 > heads: rows no pattern selects
    (32, 4, 8, [(32, 1)], True),
]


def random_problem(n: int, heads: int, d: int, seed: int, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, heads, d)).astype(dtype) for _ in range(4)]   # q, k, v, dout


def reference_grads(q, k, v, dout, patterns, causal):
    """dQ, dK, dV of the dense float64 reference (serialized = natural order here), by autograd."""
    ts = [torch.tensor(np.asarray(x, dtype=np.float64), requires_grad=True) for x in (q, k, v)]
    out = dense_dilated_attention_torch(*ts, patterns, causal)
    out.backward(torch.tensor(np.asarray(dout, dtype=np.float64)))
    return [t.grad.numpy() for t in ts]


def backward(q, k, v, dout, patterns, causal, scale=None):
    pats = [Pattern(*p) for p in patterns]
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    out, lse = local_dilated_forward(q, k, v, pats, causal, scale)
    return local_dilated_backward(q, k, v, out, lse, dout, pats, causal, scale)


def rel_error(got, want) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.mark.parametrize("case", CASES)
def test_float64_gradients_match_the_dense_reference(case):
    n, heads, d, patterns, causal = case
    q, k, v, dout = random_problem(n, heads, d, seed=n + heads)
    got = backward(q, k, v, dout, patterns, causal)
    for name, g, want in zip(("dq", "dk", "dv"), got, reference_grads(q, k, v, dout, patterns, causal)):
        assert g.dtype == np.float64
        assert rel_error(g, want) <= 1e-10, name


@pytest.mark.parametrize("case", CASES[:3])
def test_float32_gradients_match_the_dense_reference(case):
    n, heads, d, patterns, causal = case
    q, k, v, dout = random_problem(n, heads, d, seed=7, dtype=np.float32)
    got = backward(q, k, v, dout, patterns, causal)
    for name, g, want in zip(("dq", "dk", "dv"), got, reference_grads(q, k, v, dout, patterns, causal)):
        assert g.dtype == np.float32
        assert rel_error(g, want) <= 1e-5, name


def test_rows_no_pattern_selects_get_zero_gradients():
    q, k, v, dout = random_problem(40, 2, 4, seed=3)
    dq, dk, dv = backward(q, k, v, dout, [(20, 5)], False)     # heads 0, 1: offsets 0, 1 of 5
    unselected = (np.arange(40)[:, None] % 5) != np.arange(2)[None, :]
    for g in (dq, dk, dv):
        assert np.all(g[unselected] == 0) and np.all(g[~unselected] != 0)


@pytest.mark.parametrize("causal", [False, True])
def test_small_tiles_give_the_same_gradients(causal, monkeypatch):
    """Many query and key tiles (causal tiles skipped and masked) sum to the one-tile result."""
    from hilbert_hpc.core import blockwise

    rng = np.random.default_rng(11)
    q, k, v, dout = (rng.standard_normal((3, 37, 6)) for _ in range(4))
    _, lse = attend(q, k, v, 0.4, 0 if causal else None)
    out, _ = attend(q, k, v, 0.4, 0 if causal else None)
    delta = np.einsum("bmd,bmd->bm", dout, out)
    whole = attend_backward(q, k, v, lse, delta, dout, 0.4, 0 if causal else None)
    monkeypatch.setattr(blockwise, "KEY_TILE", 8)
    tiled = attend_backward(q, k, v, lse, delta, dout, 0.4, 0 if causal else None, tile_elements=20)
    for a, b in zip(whole, tiled):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14)


def test_forward_output_is_unchanged_by_returning_the_log_sum_exp():
    from hilbert_hpc.core.dilated import local_dilated_attention

    q, k, v, _ = random_problem(48, 3, 5, seed=1)
    pats = [Pattern(12, 1), Pattern(48, 4)]
    out, lse = local_dilated_forward(q, k, v, pats, True, 0.3)
    assert np.array_equal(out, local_dilated_attention(q, k, v, pats, True, 0.3))
    assert lse.shape == (48, 3) and np.isneginf(lse).sum() == 0
