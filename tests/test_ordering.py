"""Serialization orders: bijection, inverse, unit steps, agreement with ``hilbertcurve``, locality."""

from __future__ import annotations

import numpy as np
import pytest

from hilbert_hpc import ORDERINGS, inverse_order, serialization_order
from hilbert_hpc.core.hilbert import bits_for, hilbert_decode, hilbert_encode
from hilbert_hpc.tools.locality import surface_per_token
from hilbert_hpc.core.ordering import tile_shape

GRIDS = [(1,), (17,), (64,), (8, 8), (16, 32), (200, 120), (7, 1), (4, 4, 4), (45, 37, 23), (3, 5, 2, 4)]


def _coords(grid, perm):
    return np.stack(np.unravel_index(perm, grid), axis=1)


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("ordering", ["natural", "hilbert"])
def test_bijection_and_inverse(grid, ordering):
    perm = serialization_order(grid, ordering)
    n = int(np.prod(grid))
    assert perm.dtype == np.int64 and perm.shape == (n,)
    assert np.array_equal(np.sort(perm), np.arange(n))
    inv = inverse_order(perm)
    assert np.array_equal(perm[inv], np.arange(n))
    assert np.array_equal(inv[perm], np.arange(n))


@pytest.mark.parametrize("grid", [(2, 2), (8, 8), (64, 64), (4, 4, 4), (16, 16, 16), (4, 4, 4, 4), (32,)])
def test_unit_steps_on_power_of_two_cubes(grid):
    coords = _coords(grid, serialization_order(grid, "hilbert"))
    steps = np.abs(np.diff(coords, axis=0)).sum(axis=1)
    assert np.all(steps == 1)


@pytest.mark.parametrize("dims,bits", [(2, 1), (2, 3), (2, 6), (3, 2), (3, 4), (4, 2)])
def test_agrees_with_hilbertcurve_package(dims, bits):
    hc_mod = pytest.importorskip("hilbertcurve.hilbertcurve")
    curve = hc_mod.HilbertCurve(bits, dims)
    side = 1 << bits
    coords = np.indices((side,) * dims).reshape(dims, -1).T
    ours = hilbert_encode(coords, bits)
    theirs = np.array(curve.distances_from_points(coords.tolist()), dtype=np.uint64)
    assert np.array_equal(ours, theirs)


def test_hilbertcurve_package_is_installed():
    """The agreement test above must not silently skip in CI."""
    import hilbertcurve  # noqa: F401


@pytest.mark.parametrize("dims,bits", [(1, 5), (2, 7), (3, 5), (5, 3)])
def test_decode_inverts_encode(dims, bits):
    rng = np.random.default_rng(dims * 100 + bits)
    keys = rng.choice(1 << (dims * bits), size=min(500, 1 << (dims * bits)), replace=False).astype(np.uint64)
    pts = hilbert_decode(keys, dims, bits)
    assert pts.min() >= 0 and pts.max() < (1 << bits)
    assert np.array_equal(hilbert_encode(pts, bits), keys)


def test_encode_rejects_bad_input():
    with pytest.raises(ValueError, match="coordinates"):
        hilbert_encode(np.array([[0, 4]]), 2)
    with pytest.raises(ValueError, match="64-bit"):
        hilbert_encode(np.zeros((1, 5), dtype=np.int64), 13)
    assert bits_for(1) == 1 and bits_for(2) == 1 and bits_for(3) == 2 and bits_for(256) == 8


def test_cached_and_read_only():
    a = serialization_order((32, 32), "hilbert")
    b = serialization_order([32, 32], "hilbert")
    assert a is b
    with pytest.raises(ValueError):
        a[0] = 1


def test_natural_is_identity():
    assert np.array_equal(serialization_order((6, 7), "natural"), np.arange(42))


@pytest.mark.parametrize("n,segment", [(64, 16), (96, 12), (1024, 256), (60, 60), (35, 7)])
def test_segment_variant_stays_in_its_segment(n, segment):
    perm = serialization_order((n,), "hilbert-segment", segment=segment)
    assert np.array_equal(np.sort(perm), np.arange(n))
    blocks = perm.reshape(-1, segment)
    assert np.array_equal(blocks.min(axis=1), np.arange(0, n, segment))
    assert np.array_equal(blocks.max(axis=1), np.arange(segment - 1, n, segment))
    a, b = tile_shape(segment)
    assert a * b == segment and a <= b


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="unknown ordering"):
        serialization_order((4, 4), "zorder")
    with pytest.raises(ValueError, match="grid"):
        serialization_order((4, 0), "hilbert")
    with pytest.raises(ValueError, match="segment"):
        serialization_order((64,), "hilbert-segment")
    with pytest.raises(ValueError, match="divide"):
        serialization_order((64,), "hilbert-segment", segment=10)
    assert set(ORDERINGS) == {"natural", "hilbert", "hilbert-segment"}


def test_locality_hilbert_beats_row_major():
    grid = (256, 256)
    nat = surface_per_token(grid, serialization_order(grid, "natural"), 96)
    hil = surface_per_token(grid, serialization_order(grid, "hilbert"), 96)
    assert 1.9 < nat < 2.1
    assert hil < 0.5
    grid3 = (45, 37, 23)
    assert surface_per_token(grid3, serialization_order(grid3, "hilbert"), 1000) < \
        0.5 * surface_per_token(grid3, serialization_order(grid3, "natural"), 1000)


def test_surface_of_single_chunk_is_zero():
    grid = (8, 8)
    assert surface_per_token(grid, serialization_order(grid, "hilbert"), 64) == 0.0
