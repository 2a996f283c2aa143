"""Which rank owns which tokens: serialized shards and the rings of long patterns (docs/semantics.md, section 8).

Every rank holds ``L = N / P`` serialized positions, in one of two placements:

``contiguous``  rank ``p`` owns ``[p*L, (p+1)*L)``.
``zigzag``      the sequence is cut into ``2P`` chunks of ``C = L / 2``; rank ``p``
                owns chunks ``p`` and ``2P-1-p``, in that order (its local rows
                ``0..C-1`` and ``C..L-1``). Under a causal mask every rank then
                holds as much early as late work: the balanced layout.

Each rank's rows are whole chunks (``C = L`` for contiguous), so inside a chunk the
serialization order and its locality are untouched. A pattern with segment
``w <= C`` is local (``C`` must be a multiple of ``w``); one with ``w > C`` spans
``g = w / C`` chunks (``w`` must be a multiple of ``C``) held by a ring of
``min(g, P)`` ranks. Zigzag needs ``g`` to divide ``P`` (a ring of ranks whose
first chunks make one segment and whose second chunks make another) or ``g = 2P``
(one segment over all ranks). The dilation need not divide ``C``: each rank
selects the rows of each chunk whose position inside the segment is ``o mod r``.

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
from hilbert_hpc.core.work import PLACEMENTS, spans_of


def check_distribution(tokens: int, ranks: int, patterns: Sequence[Pattern], param: str = "patterns",
                       placement: str = "contiguous") -> None:
    """Refuse rank counts whose shard (or chunk) boundaries cut a segment in a way the ring cannot handle."""
    if placement not in PLACEMENTS:
        raise ConfigError(f"unknown placement {placement!r}; choose one of {', '.join(PLACEMENTS)}", "placement")
    pieces = ranks if placement == "contiguous" else 2 * ranks
    if tokens % pieces:
        what = f"{ranks} ranks" if placement == "contiguous" else f"the {pieces} zigzag chunks of {ranks} ranks"
        raise ConfigError(f"{what} do not divide the sequence length {tokens}",
                          "ranks" if placement == "contiguous" else "placement")
    chunk = tokens // pieces
    unit = "shard" if placement == "contiguous" else "zigzag chunk"
    for i, p in enumerate(patterns):
        if p.segment <= chunk and chunk % p.segment:
            raise ConfigError(f"segment {p.segment} does not divide the {unit} length {chunk} "
                              f"({tokens} tokens / {pieces} {unit}s)", f"{param}[{i}]")
        if p.segment > chunk and p.segment % chunk:
            raise ConfigError(f"segment {p.segment} is not a multiple of the {unit} length {chunk} "
                              f"({tokens} tokens / {pieces} {unit}s)", f"{param}[{i}]")
        group = p.segment // chunk
        if placement == "zigzag" and p.segment > chunk and group != pieces and ranks % group:
            raise ConfigError(f"segment {p.segment} spans {group} zigzag chunks of {chunk} tokens: zigzag needs a "
                              f"number of chunks dividing the {ranks} ranks, or all {pieces}", f"{param}[{i}]")


def zigzag_possible(tokens: int, ranks: int, patterns: Sequence[Pattern]) -> bool:
    """Whether ``check_distribution`` accepts the zigzag placement (and more than one rank shares the work)."""
    try:
        check_distribution(tokens, ranks, patterns, placement="zigzag")
    except ConfigError:
        return False
    return ranks > 1


@dataclass(frozen=True)
class Piece:
    """One run of consecutive serialized positions a rank holds: ``start``, ``rows``, and ``row0`` its first
    local row."""

    start: int
    rows: int
    row0: int


@dataclass(frozen=True)
class Shards:
    """The assignment of ``tokens`` serialized positions to ``ranks`` ranks (``placement``, ``PLACEMENTS``)."""

    tokens: int
    ranks: int
    placement: str = "contiguous"

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")

    @property
    def shard(self) -> int:
        """Tokens per rank L."""
        return self.tokens // self.ranks

    @property
    def chunk(self) -> int:
        """Length C of the runs of consecutive positions a rank holds (L, or L / 2 for zigzag)."""
        return self.shard if self.placement == "contiguous" else self.shard // 2

    def pieces(self, rank: int) -> list[Piece]:
        """The runs of serialized positions of ``rank``, in local row order (``core.work.spans_of``)."""
        return [Piece(start, stop - start, i * self.chunk)
                for i, (start, stop) in enumerate(spans_of(self.tokens, self.ranks, self.placement, rank))]

    def serialized(self, rank: int) -> np.ndarray:
        """Serialized positions of ``rank``'s local rows."""
        return np.concatenate([np.arange(p.start, p.start + p.rows, dtype=np.int64) for p in self.pieces(rank)])

    def owner(self, serialized: np.ndarray) -> np.ndarray:
        """Rank holding each serialized position."""
        s = np.asarray(serialized, dtype=np.int64)
        if self.placement == "contiguous":
            return s // self.shard
        c = s // self.chunk
        return np.where(c < self.ranks, c, 2 * self.ranks - 1 - c)

    def local_rows(self, serialized: np.ndarray) -> np.ndarray:
        """Local row of each serialized position on the rank holding it."""
        s = np.asarray(serialized, dtype=np.int64)
        if self.placement == "contiguous":
            return s % self.shard
        c = s // self.chunk
        return s % self.chunk + np.where(c < self.ranks, 0, self.chunk)

    def storage(self, serialized: np.ndarray) -> np.ndarray:
        """Index of each serialized position when the ranks' shards are laid end to end in rank order."""
        return self.owner(serialized) * self.shard + self.local_rows(serialized)

    def ring_ranks(self, pattern: Pattern) -> int:
        """Ranks in the ring of a long pattern (``pattern.segment > chunk``)."""
        return min(pattern.segment // self.chunk, self.ranks)


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
    placement: str = "contiguous"

    @property
    def tokens(self) -> int:
        """Sequence length N."""
        return int(np.prod(self.grid))

    @property
    def shard(self) -> int:
        """Tokens per rank L."""
        return self.tokens // self.ranks

    @property
    def shards(self) -> Shards:
        """Which serialized positions each rank holds."""
        return Shards(self.tokens, self.ranks, self.placement)

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
        """Natural indices of the tokens rank ``rank`` owns, in the order of its local rows."""
        return self.natural_of(self.shards.serialized(rank))

    def owner(self, serialized: np.ndarray) -> np.ndarray:
        """Rank owning each serialized position."""
        return self.shards.owner(serialized)

    def local_rows(self, serialized: np.ndarray) -> np.ndarray:
        """Local row of each serialized position on its owner."""
        return self.shards.local_rows(serialized)


class IndexView:
    """``view[idx]`` applies a layout mapping, so the float64 reference can use it like an array."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def __getitem__(self, idx: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx)
        return self.fn(idx.ravel()).reshape(idx.shape)
