"""The float64 gradients of sampled rows (core.reference_backward) against the whole sequence's exact backward."""

from __future__ import annotations

import numpy as np
import pytest

from hilbert_hpc.core import reference_backward as rb
from hilbert_hpc.core.backward import local_dilated_backward
from hilbert_hpc.core.dilated import local_dilated_forward
from hilbert_hpc.core.patterns import parse_patterns
from hilbert_hpc.core.reference_backward import reference_bytes, reference_gradient_rows

PROBLEMS = [  # tokens, heads, patterns, causal: local, overlapping, global (r > heads) and repeated patterns
    (256, 3, [(32, 1), (64, 4), (256, 16)], False),
    (256, 3, [(32, 1), (64, 4), (256, 16)], True),
    (512, 8, [(64, 1), (128, 2), (512, 8), (512, 512)], True),
    (128, 2, [(128, 1)], False),
    (256, 5, [(64, 2), (64, 2), (256, 4)], True),
]


def _whole(tokens, heads, patterns, causal, seed=0, head_dim=8, scale=0.3):
    rng = np.random.default_rng(seed)
    x = {n: rng.standard_normal((tokens, heads, head_dim)) for n in ("q", "k", "v", "do")}
    out, lse = local_dilated_forward(x["q"], x["k"], x["v"], patterns, causal, scale)
    grads = local_dilated_backward(x["q"], x["k"], x["v"], out, lse, x["do"], patterns, causal, scale)
    return x, grads


@pytest.mark.parametrize("tokens,heads,patterns,causal", PROBLEMS)
@pytest.mark.parametrize("small_chunks", [False, True])
def test_sampled_rows_match_the_whole_sequence_backward(monkeypatch, tokens, heads, patterns, causal, small_chunks):
    if small_chunks:   # many chunks, segments split into pieces, padding: the same numbers
        monkeypatch.setattr(rb, "SCORE_ELEMENTS", 200)
        monkeypatch.setattr(rb, "KEY_ROWS", 40)
    patterns = parse_patterns(patterns)
    x, grads = _whole(tokens, heads, patterns, causal)
    rows = np.sort(np.random.default_rng(1).choice(tokens, 20, replace=False))
    asked = []

    def source(name, positions):
        asked.append(len(positions))
        return x[name][positions]

    got = reference_gradient_rows(rows, source=source, heads=heads, patterns=patterns, causal=causal, scale=0.3)
    for g, whole in zip(got, grads):
        ref = whole[rows]
        assert np.abs(g - ref).max() <= 1e-13 * np.abs(ref).max()


def test_a_wrong_input_row_shows_in_the_gradients():
    patterns = parse_patterns([(32, 1), (128, 4)])
    x, grads = _whole(128, 2, patterns, False)
    rows = np.array([5, 40, 77])
    moved = {n: a.copy() for n, a in x.items()}
    moved["v"][41] += 1e-3           # a key of row 40's segment: its dQ changes, and dK of the rows attending it
    got = reference_gradient_rows(rows, source=lambda n, p: moved[n][p], heads=2, patterns=patterns, causal=False,
                                  scale=0.3)
    assert np.abs(got[0][1] - grads[0][40]).max() > 1e-6


def test_the_reference_reads_only_the_blocks_of_its_rows():
    # one row of a 4096-token sequence with a local pattern: its keys and the queries of its block, not the sequence
    patterns = parse_patterns([(64, 1)])
    rng = np.random.default_rng(2)
    seen = set()

    def source(name, positions):
        seen.update(np.asarray(positions).tolist())
        return rng.standard_normal((len(positions), 2, 4))

    reference_gradient_rows(np.array([1000]), source=source, heads=2, patterns=patterns, causal=False, scale=0.5)
    assert seen and min(seen) >= 960 and max(seen) < 1024


def test_rows_must_be_sorted_and_distinct():
    with pytest.raises(ValueError):
        reference_gradient_rows(np.array([3, 3]), source=None, heads=1, patterns=parse_patterns([(4, 1)]),
                                causal=False, scale=1.0)


def test_reference_bytes_bounds_the_stat_rows_and_grows_with_the_rows():
    patterns = parse_patterns([(2048, 1), (8192, 4)])
    one, four = (reference_bytes(1 << 22, 8, 64, patterns, r) for r in (1, 4))
    assert four - one == 3 * 8 * ((1 + 2048 + 2048) * (3 * 512 + 16) + 6 * 512)     # gradients and their terms
    assert reference_bytes(1 << 10, 8, 64, patterns, 10 ** 6) < reference_bytes(1 << 22, 8, 64, patterns, 10 ** 6)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_the_reference_on_the_gpu_gives_the_host_numbers(causal):
    from conftest import gpu_available

    if not gpu_available():
        pytest.skip("needs an NVIDIA GPU (CuPy)")
    import cupy

    patterns = parse_patterns([(64, 1), (128, 2), (512, 8), (512, 512)])
    x, grads = _whole(512, 8, patterns, causal)
    rows = np.sort(np.random.default_rng(3).choice(512, 12, replace=False))
    got = reference_gradient_rows(rows, source=lambda n, p: cupy.asarray(x[n][p]), heads=8, patterns=patterns,
                                  causal=causal, scale=0.3, xp=cupy)
    for g, whole in zip(got, grads):
        assert isinstance(g, cupy.ndarray)
        assert np.abs(g.get() - whole[rows]).max() <= 1e-13 * np.abs(whole[rows]).max()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16", "float16"])
def test_rows_rounded_on_the_gpu_as_on_the_host(dtype):
    from conftest import gpu_available

    if not gpu_available():
        pytest.skip("needs an NVIDIA GPU (CuPy)")
    import cupy

    from hilbert_hpc.core.precision import precision

    x = np.random.default_rng(4).standard_normal(4096).astype(np.float32) * 100
    x[:6] = [np.nan, -np.nan, np.inf, -np.inf, np.finfo(np.float32).max, -0.0]
    x[6:8] = np.array([0x7F800001, 0xFFFF8001], dtype=np.uint32).view(np.float32)   # NaNs near the rounding edge
    prec = precision(dtype)
    assert np.array_equal(prec.round_on(cupy.asarray(x), cupy).get(), prec.round(x), equal_nan=True)
