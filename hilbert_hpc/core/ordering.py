"""Serialization orders: which natural index sits at each serialized position.

``perm = serialization_order(grid, ordering)`` is an int64 array with
``perm[s]`` = natural (row-major) index of serialized position ``s``;
``inverse_order(perm)[i]`` is the serialized position of natural index ``i``.

Orderings:

``natural``
    Row-major order of the grid (the identity).
``hilbert``
    The N-D Hilbert curve of the smallest power-of-two cube enclosing the grid,
    restricted to the grid's points (any number of axes, any extents). On
    power-of-two cubes consecutive positions are grid neighbours; on other
    grids the curve skips the points outside, keeping its locality.
``hilbert-segment``
    The natural sequence cut into blocks of ``segment`` tokens; each block is
    folded row-major into an ``a x (segment / a)`` tile (``a`` the largest
    divisor with ``a * a <= segment``) and traversed along the 2-D Hilbert
    curve of that tile. Tokens never leave their block, so segment membership
    of the natural order is preserved.

Orders are cached per (grid, ordering, segment) and returned read-only.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from hilbert_hpc.core.hilbert import MAX_KEY_BITS, bits_for, hilbert_encode
from hilbert_hpc.errors import ConfigError

ORDERINGS = ("natural", "hilbert", "hilbert-segment")


def is_positive_int(value: Any) -> bool:
    """Whether ``value`` is an integer >= 1: a Python or NumPy integer, not a bool (nor a float such as 4.0)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and value >= 1


def _grid_tuple(grid: Sequence[int] | int) -> tuple[int, ...]:
    """The grid as a tuple of Python ints (ValueError for anything but a non-empty list of positive integers:
    an extent such as 8.5 or 8.0 is refused, not truncated)."""
    dims = (grid,) if np.isscalar(grid) else tuple(grid)
    if not dims or not all(is_positive_int(g) for g in dims):
        raise ValueError(f"grid must be a non-empty list of positive integer extents, got {list(dims)}")
    return tuple(int(g) for g in dims)


def hilbert_curve_order(grid: Sequence[int]) -> np.ndarray:
    """Natural indices of ``grid`` sorted by Hilbert key on the enclosing power-of-two cube."""
    dims = _grid_tuple(grid)
    bits = max(bits_for(g) for g in dims)
    if bits * len(dims) > MAX_KEY_BITS:
        raise ValueError(f"grid {list(dims)} is too large for {MAX_KEY_BITS}-bit Hilbert keys")
    coords = np.indices(dims, dtype=np.int64).reshape(len(dims), -1).T
    keys = hilbert_encode(coords, bits)
    return np.argsort(keys, kind="stable").astype(np.int64)


def tile_shape(segment: int) -> tuple[int, int]:
    """The most nearly square ``(a, segment // a)`` tile holding ``segment`` tokens."""
    a = int(np.sqrt(segment))
    while segment % a:
        a -= 1
    return a, segment // a


def segment_hilbert_order(n: int, segment: int) -> np.ndarray:
    """Per-segment order: each block of ``segment`` tokens follows the 2-D Hilbert curve of its tile."""
    if segment < 1 or n % segment:
        raise ValueError(f"segment {segment} must be positive and divide the sequence length {n}")
    local = hilbert_curve_order(tile_shape(segment))
    starts = np.arange(0, n, segment, dtype=np.int64)
    return (starts[:, None] + local[None, :]).reshape(-1)


@lru_cache(maxsize=64)
def _cached_order(dims: tuple[int, ...], ordering: str, segment: int | None) -> np.ndarray:
    n = int(np.prod(dims))
    if ordering == "natural":
        perm = np.arange(n, dtype=np.int64)
    elif ordering == "hilbert":
        perm = hilbert_curve_order(dims)
    else:
        perm = segment_hilbert_order(n, segment)
    perm.flags.writeable = False
    return perm


def serialization_order(grid: Sequence[int] | int, ordering: str = "hilbert", *,
                        segment: int | None = None) -> np.ndarray:
    """The serialization permutation of ``grid`` (read-only int64 array of length prod(grid)).

    ``ordering`` is one of :data:`ORDERINGS`; ``segment`` is required by
    ``hilbert-segment`` (the block length) and ignored otherwise.
    """
    dims = _grid_tuple(grid)
    if ordering not in ORDERINGS:
        raise ValueError(f"unknown ordering {ordering!r}; choose one of {', '.join(ORDERINGS)}")
    if ordering == "hilbert-segment":
        if segment is None:
            raise ValueError("ordering 'hilbert-segment' needs a segment length")
        if not is_positive_int(segment):
            raise ValueError(f"segment must be a positive integer, got {segment!r}")
        segment = int(segment)
    else:
        segment = None
    return _cached_order(dims, ordering, segment)


def inverse_order(perm: np.ndarray) -> np.ndarray:
    """Inverse permutation: ``inv[perm[s]] = s`` (O(N), no sort)."""
    perm = np.asarray(perm)
    inv = np.empty(perm.shape[0], dtype=np.int64)
    inv[perm] = np.arange(perm.shape[0], dtype=np.int64)
    return inv


def resolve_ordering(ordering: str, patterns: Sequence[Any], segment: int | None = None,
                     tokens: int | None = None) -> tuple[str, int | None]:
    """Validate ``ordering`` and its ``segment`` (ConfigError naming the argument); return the ordering and its
    block length.

    The per-segment order folds the shortest pattern segment unless told otherwise; a ``segment`` must be a
    positive integer (dividing ``tokens`` when given) and is refused with the other orderings, which have none.
    """
    if ordering not in ORDERINGS:
        raise ConfigError(f"unknown ordering {ordering!r}; choose one of {', '.join(ORDERINGS)}", "ordering")
    if ordering != "hilbert-segment":
        if segment is not None:
            raise ConfigError(f'only applies to ordering="hilbert-segment", not "{ordering}"', "segment")
        return ordering, None
    if segment is not None and not is_positive_int(segment):
        raise ConfigError(f"expected a positive integer, got {segment!r}", "segment")
    block = int(segment) if segment is not None else min(p.segment for p in patterns)
    if tokens is not None and tokens % block:
        raise ConfigError(f"segment {block} does not divide the sequence length {tokens}", "segment")
    return ordering, block


def problem_order(grid: Sequence[int], ordering: str, segment: int | None) -> np.ndarray:
    """The serialization permutation, with parameter errors turned into ConfigErrors."""
    try:
        return serialization_order(tuple(grid), ordering, segment=segment)
    except ValueError as exc:
        raise ConfigError(str(exc), "ordering") from None
