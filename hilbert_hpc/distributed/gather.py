"""The gather schedule of a long pattern: every rank of its group holds the group's selected K/V rows at once.

docs/distributed.md, "Long-pattern schedules". Each rank packs its selected K/V
rows once (the ring's block, ``distributed.ring.RingPattern``)
and exchanges it with the ranks of its group that need it, every message posted
together (before the local patterns run, so the exchange hides behind them).
The received blocks lie side by side in rank order; one copy
(:meth:`GatherPattern.to_sequence`, a single ``take``) puts them in sequence
order, one region per segment and head offset: K rows (rows, heads of the
offset, dk) then V rows. A query piece then attends to the whole pattern in one
launch per head offset (:meth:`GatherPattern.launches`): its keys are a prefix
(causal: the keys up to its own last row, shift = its first row's index) or all
of its segment's rows. In the backward the dK/dV terms of the sequence-order
rows go back to rank order (the inverse copy) and home to their owners in one
exchange, where they are summed in rank order.

Which blocks a rank needs is decided once (``RingPattern.pairs``): under a
contiguous causal mask only those of earlier ranks, so no more bytes move than
in the ring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hilbert_hpc.core.blockwise import array_module
from hilbert_hpc.core.launch_geometry import coalesce_heads
from hilbert_hpc.distributed.sharding import count

Array = Any


@dataclass
class Region:
    """One segment's selected rows of one head offset, in sequence order: K at element ``k0`` (rows, nh, dk),
    V at ``v0`` (rows, nh, dv); ``first[(position, piece)]`` the index of that piece's first row among them."""

    index: int
    offset: int
    nheads: int
    k0: int = 0
    v0: int = 0
    rows: int = 0
    first: dict[tuple[int, int], int] = field(default_factory=dict)


class GatherPattern:
    """The gather geometry of one long pattern on this rank (``ring``: its ``distributed.ring.RingPattern``, the
    packing of every rank's block)."""

    def __init__(self, ring: Any, causal: bool) -> None:
        self.ring = ring
        self.causal = causal
        g, pos = ring.group, ring.pos
        self.sizes = [ring.block_size(s) for s in range(g)]
        self.displs = [int(x) for x in np.concatenate([[0], np.cumsum(self.sizes)[:-1]])]
        self.total = int(sum(self.sizes))
        #: ring positions whose blocks this rank attends to / that attend to this rank's block (itself excluded)
        self.sources = [s for s in range(g) if s != pos and ring.pairs(pos, s, causal)]
        self.targets = [s for s in range(g) if s != pos and ring.pairs(s, pos, causal)]
        self.unit = math.gcd(ring.dk, ring.dv)
        self.regions: dict[tuple[int, int], Region] = {}
        self._launches: dict[tuple[float, int, int], tuple[dict, ...]] = {}
        self._layout()

    def _segment(self, start: int) -> int:
        return start // self.ring.pattern.segment

    def _layout(self) -> None:
        """Regions of the segments this rank's pieces lie in, and the unit index from rank order to them."""
        ring, g = self.ring, self.ring.group
        w = ring.pattern.segment
        mine = sorted({self._segment(pc.start) for pc in ring.pieces(ring.pos)})
        # every piece of the group in those segments, in sequence order
        pieces = sorted((pc.start, s, k) for s in range(g) for k, pc in enumerate(ring.pieces(s))
                        if pc.start // w in mine)
        cursor, copies = 0, []
        for seg in mine:
            for i, o in enumerate(ring.offsets):
                nh = ring.nheads(o)
                region = Region(i, o, nh)
                parts = []
                for start, s, k in pieces:
                    if self._segment(start) != seg:
                        continue
                    part = ring.part(s, i, k)
                    region.first[s, k] = region.rows
                    parts.append((s, part, region.rows))
                    region.rows += part.rows
                region.k0 = cursor
                region.v0 = cursor + region.rows * nh * ring.dk
                for s, part, row in parts:
                    copies.append((self.displs[s] + part.k0, region.k0 + row * nh * ring.dk, part.rows * nh * ring.dk))
                    copies.append((self.displs[s] + part.v0, region.v0 + row * nh * ring.dv, part.rows * nh * ring.dv))
                cursor = region.v0 + region.rows * nh * ring.dv
                self.regions[seg, i] = region
        self.sequence_elements = cursor
        u = self.unit
        index = np.empty(cursor // u, dtype=np.int64)
        for src, dst, n in copies:
            index[dst // u:(dst + n) // u] = np.arange(src // u, (src + n) // u)
        self.index = index
        #: True when the sequence-order regions hold every gathered row (every row of the group is in one of
        #: this rank's segments: so the distribution makes it)
        self.covers_all = cursor == self.total
        self._device_index: dict[Any, Array] = {}

    def index_on(self, xp: Any) -> Array:
        """The unit index (sequence-order unit -> rank-order unit) as an array of ``xp`` (kept per module)."""
        key = xp.__name__
        if key not in self._device_index:
            self._device_index[key] = xp.asarray(self.index)
        return self._device_index[key]

    # -- the exchange -------------------------------------------------------------------------------------------
    def block(self, gathered: Array, pos: int) -> Array:
        """The slot of ring position ``pos``'s block in a rank-order buffer of ``total`` elements."""
        return gathered[self.displs[pos]:self.displs[pos] + self.sizes[pos]]

    def start_gather(self, gathered: Array, transport: Any, tag: int) -> Any:
        """Post the exchange of this rank's block (already packed into its slot of ``gathered``) with the ranks
        that need it, and the receives of the blocks this rank needs into their slots; returns it."""
        mine = self.block(gathered, self.ring.pos)
        sends = [(mine, self.ring.rank_of(s)) for s in self.targets]
        recvs = [(self.block(gathered, s), self.ring.rank_of(s)) for s in self.sources]
        return transport.start_many(sends, recvs, tag)

    def start_home(self, terms: Array, home: Array, transport: Any, tag: int) -> Any:
        """Post the dK/dV terms of the other ranks' rows (rank order, ``terms``) to their owners, and the receives
        of this rank's terms from the ranks that attended to its block (``home``: one slot of this rank's block
        size per rank of ``targets``, in that order)."""
        size = self.sizes[self.ring.pos]
        sends = [(self.block(terms, s), self.ring.rank_of(s)) for s in self.sources]
        recvs = [(home[j * size:(j + 1) * size], self.ring.rank_of(s)) for j, s in enumerate(self.targets)]
        return transport.start_many(sends, recvs, tag)

    # -- between orders -----------------------------------------------------------------------------------------
    def to_sequence(self, gathered: Array, out: Array) -> Array:
        """Copy rank-order ``gathered`` into sequence order ``out`` (``sequence_elements``) in one ``take``."""
        xp = array_module(gathered)
        u = self.unit
        xp.take(gathered.reshape(-1, u), self.index_on(xp), axis=0, out=out.reshape(-1, u))
        return out

    def to_rank_order(self, sequence: Array, out: Array) -> Array:
        """Copy sequence-order ``sequence`` back into rank order ``out`` (``total`` elements; rows outside this
        rank's segments, which no query of it sees, are zeros)."""
        xp = array_module(sequence)
        u = self.unit
        if not self.covers_all:
            out[...] = 0
        out.reshape(-1, u)[self.index_on(xp)] = sequence.reshape(-1, u)
        return out

    # -- what to compute ----------------------------------------------------------------------------------------
    def problems(self) -> list[tuple[int, Region, slice, int, int, int | None]]:
        """``(query piece, region, local query rows, mq, mk, shift)`` of this rank's queries: each piece and head
        offset against the keys of its segment it sees (causal: up to its own rows, ``shift`` its first row's
        index among them)."""
        ring = self.ring
        out = []
        for qi, pc in enumerate(ring.pieces(ring.pos)):
            for i, o in enumerate(ring.offsets):
                region = self.regions[self._segment(pc.start), i]
                rows = ring.rows(ring.pos, qi, o)
                mq = count(rows)
                first = region.first[ring.pos, qi]
                mk = first + mq if self.causal else region.rows
                if mq and mk:
                    out.append((qi, region, rows, mq, mk, first if self.causal else None))
        return out

    def launches(self, scale: float, heads: int, head_dim: int) -> tuple[dict, ...]:
        """The fused kernels' launches (keyword arguments of a launcher, as ``kernels.launch.ring_launches``) of
        :meth:`problems`, keys and values addressed in the sequence-order buffer; worked out once (every call
        launches them; they are read, never changed)."""
        key = (float(scale), int(heads), int(head_dim))
        if key not in self._launches:
            self._launches[key] = tuple(self._make_launches(*key))
        return self._launches[key]

    def _make_launches(self, scale: float, heads: int, head_dim: int) -> list[dict]:
        d, row, hrow = head_dim, heads * head_dim, heads
        r = self.ring.pattern.dilation
        out = []
        for _, region, rows, mq, mk, shift in self.problems():
            nh = region.nheads
            out.append(dict(qg=(rows.start * row + region.offset * d, 0, r * d, r * row),
                            kg=(region.k0, 0, d, nh * d), vg=(region.v0, 0, d, nh * d),
                            lg=(rows.start * hrow + region.offset, 0, r, r * hrow), segments=1, heads=nh, mq=mq,
                            mk=mk, shift=shift, scale=scale, head_dim=d))
        return coalesce_heads(out)

    def keys(self, sequence: Array, region: Region, mk: int) -> tuple[Array, Array]:
        """K (nh, mk, dk) and V (nh, mk, dv) views of the first ``mk`` rows of ``region`` in ``sequence`` (heads
        first, as the block functions take them; an accumulator buffer of the same layout gives its dK/dV)."""
        ring, nh = self.ring, region.nheads
        k = sequence[region.k0:region.k0 + region.rows * nh * ring.dk].reshape(region.rows, nh, ring.dk)
        v = sequence[region.v0:region.v0 + region.rows * nh * ring.dv].reshape(region.rows, nh, ring.dv)
        return k[:mk].transpose(1, 0, 2), v[:mk].transpose(1, 0, 2)

