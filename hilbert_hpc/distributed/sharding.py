"""Which rank owns which tokens: serialized shards and the rings of long patterns (docs/semantics.md, section 8).

Rank ``p`` of ``P`` owns serialized positions ``[p*L, (p+1)*L)``, ``L = N / P``.
A pattern with segment ``w <= L`` is local (``L`` must be a multiple of ``w``);
one with ``w > L`` spans a ring of ``g = w / L`` consecutive ranks (``w`` must be
a multiple of ``L``). The dilation need not divide ``L``: each rank selects the
rows of its shard whose position inside the segment is ``o mod r``.

Natural positions of a shard come from the serialization order without holding
all ``N`` of them where the order allows: natural order is arithmetic, and the
Hilbert order of a power-of-two cube is decoded key range by key range. Other
grids need the full permutation (cached, int64, 8 bytes per token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from hilbert_hpc.errors import ConfigError
from hilbert_hpc.core.hilbert import bits_for, hilbert_decode, hilbert_encode
from hilbert_hpc.core.ordering import inverse_order, serialization_order
from hilbert_hpc.core.patterns import Pattern


def check_distribution(tokens: int, ranks: int, patterns: Sequence[Pattern], param: str = "patterns") -> None:
    """Refuse rank counts whose shard boundaries cut a segment in a way the ring cannot handle."""
    if tokens % ranks:
        raise ConfigError(f"{ranks} ranks do not divide the sequence length {tokens}", "ranks")
    shard = tokens // ranks
    for i, p in enumerate(patterns):
        if p.segment <= shard and shard % p.segment:
            raise ConfigError(f"segment {p.segment} does not divide the shard length {shard} "
                              f"({tokens} tokens / {ranks} ranks)", f"{param}[{i}]")
        if p.segment > shard and p.segment % shard:
            raise ConfigError(f"segment {p.segment} is not a multiple of the shard length {shard} "
                              f"({tokens} tokens / {ranks} ranks)", f"{param}[{i}]")


def selected_rows(shard_start: int, shard: int, pattern: Pattern, offset: int) -> slice:
    """Local rows of a shard starting at serialized ``shard_start`` selected by ``pattern`` for ``offset``."""
    first = (offset - shard_start % pattern.segment) % pattern.dilation
    return slice(first, shard, pattern.dilation)


def count(sl: slice) -> int:
    """Number of rows of a non-negative-step slice with explicit start/stop."""
    return max(0, -(-(sl.stop - sl.start) // sl.step))


@dataclass(frozen=True)
class Layout:
    """Serialization of one problem and its split over ``ranks`` shards."""

    grid: tuple[int, ...]
    ordering: str
    ranks: int
    segment: int | None = None

    @property
    def tokens(self) -> int:
        """Sequence length N."""
        return int(np.prod(self.grid))

    @property
    def shard(self) -> int:
        """Tokens per rank L."""
        return self.tokens // self.ranks

    def _is_pow2_cube(self) -> bool:
        g = self.grid
        return len(set(g)) == 1 and g[0] & (g[0] - 1) == 0

    def _full(self) -> np.ndarray:
        return serialization_order(self.grid, self.ordering, segment=self.segment)

    def natural_of(self, serialized: np.ndarray) -> np.ndarray:
        """Natural indices of serialized positions (``perm[serialized]``)."""
        s = np.asarray(serialized, dtype=np.int64)
        if self.ordering == "natural":
            return s.copy()
        if self.ordering == "hilbert" and self._is_pow2_cube():
            bits = bits_for(self.grid[0])
            pts = hilbert_decode(s.astype(np.uint64), len(self.grid), bits)
            return np.ravel_multi_index(tuple(pts.T), self.grid).astype(np.int64)
        return self._full()[s]

    def serialized_of(self, natural: np.ndarray) -> np.ndarray:
        """Serialized positions of natural indices (``inverse[natural]``)."""
        i = np.asarray(natural, dtype=np.int64)
        if self.ordering == "natural":
            return i.copy()
        if self.ordering == "hilbert" and self._is_pow2_cube():
            bits = bits_for(self.grid[0])
            pts = np.stack(np.unravel_index(i, self.grid), axis=1)
            return hilbert_encode(pts, bits).astype(np.int64)
        return inverse_order(self._full())[i]

    def shard_natural(self, rank: int) -> np.ndarray:
        """Natural indices of the tokens rank ``rank`` owns, in serialized order."""
        start = rank * self.shard
        return self.natural_of(np.arange(start, start + self.shard, dtype=np.int64))

    def owner(self, serialized: np.ndarray) -> np.ndarray:
        """Rank owning each serialized position."""
        return np.asarray(serialized) // self.shard


class IndexView:
    """``view[idx]`` applies a layout mapping, so the float64 reference can use it like an array."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def __getitem__(self, idx: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx)
        return self.fn(idx.ravel()).reshape(idx.shape)
