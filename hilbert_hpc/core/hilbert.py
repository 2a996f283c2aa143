"""Hilbert curve keys in any dimension: Skilling's transpose algorithm, vectorized in NumPy.

Convention (pinned, and checked against the ``hilbertcurve`` package in the
tests): a point is ``(x_0, ..., x_{d-1})`` with every coordinate in
``[0, 2**bits)``; the key interleaves the bits of Skilling's "transposed" form
with axis 0 most significant, so ``key == HilbertCurve(bits, d).distance_from_point(point)``.

Reference: J. Skilling, "Programming the Hilbert curve", AIP Conf. Proc. 707 (2004).
"""

from __future__ import annotations

import numpy as np

MAX_KEY_BITS = 64


def bits_for(extent: int) -> int:
    """Bits per axis needed to index ``extent`` points (at least 1)."""
    if extent < 1:
        raise ValueError(f"grid extent must be >= 1, got {extent}")
    return max(1, int(extent - 1).bit_length())


def _check(dims: int, bits: int) -> None:
    if dims < 1:
        raise ValueError(f"a Hilbert curve needs at least one dimension, got {dims}")
    if bits < 1:
        raise ValueError(f"bits per axis must be >= 1, got {bits}")
    if dims * bits > MAX_KEY_BITS:
        raise ValueError(f"{dims} axes x {bits} bits exceed the {MAX_KEY_BITS}-bit key")


def _interleave(x: np.ndarray, bits: int) -> np.ndarray:
    """Transposed form (n, d) -> integer keys: bit j of axis i lands at position j*d + (d-1-i)."""
    n, d = x.shape
    keys = np.zeros(n, dtype=np.uint64)
    one = np.uint64(1)
    for j in range(bits - 1, -1, -1):
        for i in range(d):
            keys = (keys << one) | ((x[:, i] >> np.uint64(j)) & one)
    return keys


def _deinterleave(keys: np.ndarray, d: int, bits: int) -> np.ndarray:
    """Integer keys -> transposed form (n, d); the inverse of :func:`_interleave`."""
    x = np.zeros((keys.shape[0], d), dtype=np.uint64)
    one = np.uint64(1)
    pos = d * bits
    for j in range(bits - 1, -1, -1):
        for i in range(d):
            pos -= 1
            x[:, i] |= ((keys >> np.uint64(pos)) & one) << np.uint64(j)
    return x


def _invert_or_exchange(x: np.ndarray, axis: int, q: int) -> None:
    """Skilling's step for bit ``q`` of ``axis``: where set, invert the low bits of axis 0; else swap them with ``axis``'s."""
    low_bits = np.uint64(q - 1)
    high = (x[:, axis] & np.uint64(q)) != 0
    x[high, 0] ^= low_bits
    low = ~high
    t = (x[low, 0] ^ x[low, axis]) & low_bits
    x[low, 0] ^= t
    x[low, axis] ^= t


def hilbert_encode(coords: np.ndarray, bits: int) -> np.ndarray:
    """Hilbert keys (uint64, shape (n,)) of integer points ``coords`` of shape (n, d).

    Every coordinate must lie in ``[0, 2**bits)``. The keys of all points of the
    cube ``[0, 2**bits)**d`` are a permutation of ``range(2**(d*bits))`` and
    consecutive keys are grid neighbours (unit steps).
    """
    coords = np.asarray(coords)
    if coords.ndim != 2:
        raise ValueError(f"coords must have shape (n, d), got {coords.shape}")
    n, d = coords.shape
    _check(d, bits)
    if n and (coords.min() < 0 or coords.max() >= (1 << bits)):
        raise ValueError(f"coordinates must lie in [0, {1 << bits}) for {bits} bits per axis")
    x = coords.astype(np.uint64, copy=True)
    # Inverse undo of excess work, from the most significant bit down.
    q = 1 << (bits - 1)
    while q > 1:
        for i in range(d):
            _invert_or_exchange(x, i, q)
        q >>= 1
    # Gray encode.
    for i in range(1, d):
        x[:, i] ^= x[:, i - 1]
    t = np.zeros(n, dtype=np.uint64)
    q = 1 << (bits - 1)
    while q > 1:
        set_ = (x[:, d - 1] & np.uint64(q)) != 0
        t[set_] ^= np.uint64(q - 1)
        q >>= 1
    x ^= t[:, None]
    return _interleave(x, bits)


def hilbert_decode(keys: np.ndarray, dims: int, bits: int) -> np.ndarray:
    """Points (int64, shape (n, dims)) of Hilbert ``keys``; the exact inverse of :func:`hilbert_encode`."""
    _check(dims, bits)
    keys = np.asarray(keys).astype(np.uint64)
    x = _deinterleave(keys, dims, bits)
    # Gray decode.
    t = x[:, dims - 1] >> np.uint64(1)
    for i in range(dims - 1, 0, -1):
        x[:, i] ^= x[:, i - 1]
    x[:, 0] ^= t
    # Undo excess work, from the least significant bit up.
    q = 2
    while q != (2 << (bits - 1)):
        for i in range(dims - 1, -1, -1):
            _invert_or_exchange(x, i, q)
        q <<= 1
    return x.astype(np.int64)
