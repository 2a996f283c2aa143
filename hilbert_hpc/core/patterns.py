"""Dilation patterns (segment length, dilation rate), problem validation and FLOP counts."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Sequence

import numpy as np

from hilbert_hpc.errors import ConfigError
from hilbert_hpc.core.hilbert import MAX_KEY_BITS, bits_for
from hilbert_hpc.core.ordering import is_positive_int, tile_shape


@dataclass(frozen=True, order=True)
class Pattern:
    """One LongNet pattern: segments of ``segment`` tokens, every ``dilation``-th token selected."""

    segment: int
    dilation: int

    @property
    def selected(self) -> int:
        """Number of selected tokens per segment and head offset."""
        return self.segment // self.dilation

    def __str__(self) -> str:
        return f"({self.segment},{self.dilation})"


def parse_patterns(patterns: Iterable, param: str = "patterns") -> tuple[Pattern, ...]:
    """Turn ``[(w, r), ...]`` (or Pattern objects) into validated Patterns.

    Checks only what does not depend on the sequence length: positive integers,
    ``r`` dividing ``w``, at least one pattern.
    """
    out = []
    try:
        items = list(patterns)
    except TypeError:
        raise ConfigError("expected a list of [segment, dilation] pairs", param) from None
    if not items:
        raise ConfigError("at least one [segment, dilation] pattern is required", param)
    for i, item in enumerate(items):
        where = f"{param}[{i}]"
        if isinstance(item, Pattern):
            w, r = item.segment, item.dilation
        else:
            try:
                w, r = item
            except (TypeError, ValueError):
                raise ConfigError(f"expected a [segment, dilation] pair, got {item!r}", where) from None
        for name, value in (("segment", w), ("dilation", r)):
            if not is_positive_int(value):
                raise ConfigError(f"{name} must be a positive integer, got {value!r}", where)
        if w % r:
            raise ConfigError(f"dilation {r} does not divide segment length {w}", where)
        out.append(Pattern(int(w), int(r)))
    return tuple(out)


def parse_grid(grid: int | Sequence[int] | None, tokens: int | None, param: str = "grid") -> tuple[int, ...]:
    """Resolve the token grid; ``None`` means the 1-D grid ``(tokens,)``."""
    if grid is None:
        if tokens is None:
            raise ConfigError("give the token grid or the number of tokens", param)
        grid = (tokens,)
    if isinstance(grid, (int, np.integer)) and not isinstance(grid, bool):
        grid = (grid,)
    if isinstance(grid, (str, bytes)):
        raise ConfigError(f"expected a list of positive integers such as [64, 64], got {grid!r}", param)
    try:
        dims = tuple(grid)
    except TypeError:
        raise ConfigError(f"expected a list of positive integers such as [64, 64], got {grid!r}", param) from None
    if not dims:
        raise ConfigError("expected a non-empty list of positive integers, got []", param)
    for i, g in enumerate(dims):
        if not is_positive_int(g):
            raise ConfigError(f"expected a non-empty list of positive integers, got {list(dims)!r} "
                              f"(entry {i} is {g!r})", param)
    n = math.prod(dims)
    if tokens is not None and n != tokens:
        raise ConfigError(f"grid product {n} does not equal the sequence length {tokens}", param)
    return tuple(int(g) for g in dims)


def check_problem(tokens: int, patterns: Sequence[Pattern], param: str = "patterns") -> None:
    """Refuse patterns whose segment length does not divide the sequence length."""
    for i, p in enumerate(patterns):
        if tokens % p.segment:
            raise ConfigError(
                f"segment length {p.segment} does not divide the sequence length {tokens}", f"{param}[{i}]"
            )


@lru_cache(maxsize=1)
def max_array_dims() -> int:
    """Most dimensions a NumPy array may have here (64 with NumPy 2, 32 with NumPy 1)."""
    for dims in (64, 32):
        try:
            np.empty((1,) * dims, dtype=np.int8)
            return dims
        except ValueError:
            continue
    return 32


def _hilbert_max_axes(grid: Sequence[int]) -> int:
    """Most axes a grid with extents like ``grid``'s may have under the ``hilbert`` ordering.

    Keys take ``axes x bits`` bits (``bits``: what the longest axis needs) of a
    64-bit integer, and the coordinates are one NumPy array of ``axes + 1``
    dimensions.
    """
    bits = max(bits_for(g) for g in grid)
    return min(MAX_KEY_BITS // bits, max_array_dims() - 1)


def check_serializable(grid: Sequence[int], ordering: str, segment: int | None = None,
                       param: str = "grid", segment_param: str = "segment") -> None:
    """Refuse a grid (or hilbert-segment block) that the ordering cannot serialize.

    ``natural`` has no limit. ``hilbert`` needs ``axes x bits <= 64`` (``bits``
    per axis: what the longest axis needs) and ``axes + 1`` NumPy dimensions.
    ``hilbert-segment`` folds each block of ``segment`` tokens into a 2-D tile
    whose longer side must fit 32 bits.
    """
    dims = tuple(int(g) for g in grid)
    if ordering == "hilbert":
        bits = max(bits_for(g) for g in dims)
        limit = _hilbert_max_axes(dims)
        if len(dims) * bits > MAX_KEY_BITS:
            raise ConfigError(f"the hilbert ordering of {len(dims)} axes needs {len(dims)} x {bits} bits "
                              f"(the longest axis, {max(dims)}, needs {bits}) = {len(dims) * bits} key bits, more "
                              f"than the {MAX_KEY_BITS}-bit Hilbert key: use at most {limit} axes of this length, "
                              f"shorter axes, or ordering = \"natural\"", param)
        if len(dims) > limit:
            raise ConfigError(f"the hilbert ordering takes at most {limit} axes here (NumPy arrays have at most "
                              f"{max_array_dims()} dimensions), the grid has {len(dims)}: merge axes or use "
                              f"ordering = \"natural\"", param)
    elif ordering == "hilbert-segment" and segment is not None:
        side = max(tile_shape(segment))
        if 2 * bits_for(side) > MAX_KEY_BITS:
            raise ConfigError(f"the hilbert-segment tile of segment {segment} is {tile_shape(segment)}; its "
                              f"longer side needs {bits_for(side)} bits, more than {MAX_KEY_BITS // 2}: choose a "
                              f"shorter segment", segment_param)


def tiles_rows(segment: int, dilation: int, n: int) -> bool:
    """Whether a pattern of this ``segment`` and ``dilation`` takes each of ``n`` rows of every head as a query and
    as a key: dilation 1 and segments that tile the rows."""
    return dilation == 1 and 0 < segment <= n and n % segment == 0


def merges_every_row(patterns: Sequence[Pattern], n: int) -> bool:
    """Whether ``patterns`` give each of ``n`` rows of every head a result: one of them tiles the rows
    (:func:`tiles_rows`), and each query of it sees at least its own key, causal or not."""
    return any(tiles_rows(int(p.segment), int(p.dilation), n) for p in patterns)


def attended_pairs(tokens: int, heads: int, patterns: Sequence[Pattern], causal: bool) -> int:
    """Number of (query, key, head) score entries the dilated attention computes."""
    total = 0
    for p in patterns:
        m = p.selected
        per_segment = m * (m + 1) // 2 if causal else m * m
        # every head has exactly one offset per pattern: m selected rows per segment
        total += (tokens // p.segment) * per_segment * heads
    return total


#: useful FLOPs of the backward per useful FLOP of the forward (dV, dP, dQ, dK: four products, plus the
#: recomputed scores; the convention of FlashAttention's benchmarks, docs/results.md)
BACKWARD_FLOPS = 2.5


def useful_flops(tokens: int, heads: int, head_dim: int, patterns: Sequence[Pattern], causal: bool,
                 batch: int = 1) -> int:
    """Useful floating-point operations: 2*D for QK^T and 2*D for PV per attended pair."""
    return 4 * head_dim * attended_pairs(tokens, heads, patterns, causal) * batch
