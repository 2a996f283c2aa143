"""Dilation patterns (segment length, dilation rate), problem validation and FLOP counts."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from .errors import ConfigError


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
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
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
    if isinstance(grid, int) and not isinstance(grid, bool):
        grid = (grid,)
    try:
        dims = tuple(grid)
    except TypeError:
        raise ConfigError(f"expected a list of positive integers, got {grid!r}", param) from None
    if not dims or any(isinstance(g, bool) or not isinstance(g, int) or g < 1 for g in dims):
        raise ConfigError(f"expected a non-empty list of positive integers, got {list(dims)!r}", param)
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


def attended_pairs(tokens: int, heads: int, patterns: Sequence[Pattern], causal: bool) -> int:
    """Number of (query, key, head) score entries the dilated attention computes."""
    total = 0
    for p in patterns:
        m = p.selected
        per_segment = m * (m + 1) // 2 if causal else m * m
        # every head has exactly one offset per pattern: m selected rows per segment
        total += (tokens // p.segment) * per_segment * heads
    return total


def useful_flops(tokens: int, heads: int, head_dim: int, patterns: Sequence[Pattern], causal: bool,
                 batch: int = 1) -> int:
    """Useful floating-point operations: 2*D for QK^T and 2*D for PV per attended pair."""
    return 4 * head_dim * attended_pairs(tokens, heads, patterns, causal) * batch
