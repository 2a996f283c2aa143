"""Distributed dilated attention: local patterns in place, long patterns around rings of ranks.

Each rank holds one serialized shard of Q, K, V (``L`` rows), made of one or two
chunks (the placement, :class:`hilbert_hpc.distributed.sharding.Shards`). Patterns
whose segments fit in a chunk are computed locally. For a pattern spanning a
ring of ranks, each rank packs the selected K/V rows of its chunks for every
head offset into one buffer (``~L/r`` rows: traffic divided by the dilation) and
the buffers rotate around the ring with ``Isend``/``Irecv``: the next block is in
flight while the current one is attended to. Which of its chunks meets which
chunk of a block is decided once (:meth:`RingPattern.pairs`). Partial results
merge by log-sum-exp. In a contiguous causal ring a rank only needs blocks from
ranks before it, so blocks stop travelling once nobody downstream needs them; a
zigzag ring gives every rank the same work at every step.

The compute side works on any NumPy-like array module (NumPy, CuPy).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from hilbert_hpc.core.blockwise import array_module, attend, merge_lse
from hilbert_hpc.core.dilated import AttendFn, accumulate_patterns, empty_accumulators
from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.distributed.sharding import Piece, Shards, count, selected_rows

Array = Any


@dataclass
class RingStats:
    """Per-rank counters of one distributed call (seconds, bytes)."""

    local_s: float = 0.0
    compute_s: float = 0.0
    wait_s: float = 0.0
    imbalance_s: float = 0.0
    pack_s: float = 0.0
    bytes_sent: int = 0
    messages: int = 0
    ring_steps: int = 0

    def add(self, other: "RingStats") -> None:
        """Accumulate another call's counters."""
        for name in ("local_s", "compute_s", "wait_s", "imbalance_s", "pack_s", "bytes_sent", "messages",
                     "ring_steps"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


def synchronize(xp: Any) -> None:
    """Wait for the GPU work queued so far (CuPy); nothing for NumPy."""
    if xp.__name__ == "cupy":
        xp.cuda.get_current_stream().synchronize()


def progress_until_done(xp: Any, exchanges: Sequence[Any]) -> None:
    """Wait for queued GPU work while driving MPI progress of ``exchanges``, so transfers advance during
    compute."""
    if xp.__name__ != "cupy":
        return
    done = xp.cuda.get_current_stream().record()
    while not done.done:
        for exchange in exchanges:
            exchange.test()


def ring_schedule(pos: int, group: int, causal: bool) -> list[tuple[int, bool, bool]]:
    """Steps ``(source position, send this step, receive this step)`` of ring position ``pos``.

    At step ``t`` a rank attends to the block that started at ``pos - t`` and
    forwards it to ``pos + 1``. Causal: only blocks from positions ``<= pos``
    are needed, so position ``pos`` runs ``pos + 1`` steps and stops forwarding
    at the end of the ring.
    """
    steps = pos + 1 if causal else group
    out = []
    for t in range(steps):
        src = (pos - t) % group
        if causal:
            send, recv = pos + 1 < group, t < pos
        else:
            send = recv = t < group - 1
        out.append((src, send, recv))
    return out


@dataclass(frozen=True)
class BlockPart:
    """Where one head offset's rows of one piece sit inside a packed block: ``index`` (position in
    ``RingPattern.offsets``), ``offset``, ``piece`` (index into the sender's pieces), ``rows``, and the element
    offsets ``k0`` / ``v0`` of its K and V."""

    index: int
    offset: int
    piece: int
    rows: int
    k0: int
    v0: int


@dataclass(frozen=True)
class PiecePair:
    """Queries of piece ``query`` against keys of piece ``key`` (indices into the pieces of the receiving and
    the sending ring position); ``shift`` 0 for the causal diagonal, None for a full block."""

    query: int
    key: int
    shift: int | None


class RingPattern:
    """Packing geometry of one long pattern for every position of the ring that ``rank`` belongs to.

    The ring is ``shards.ring_ranks(pattern)`` consecutive ranks; position ``i``
    is rank ``base + i``. A packed block holds, for every head offset and every
    piece (chunk) of the sending rank, its selected K rows then V rows.
    """

    def __init__(self, pattern: Pattern, shards: Shards, rank: int, heads: int, dk: int, dv: int) -> None:
        self.pattern = pattern
        self.shards = shards
        self.group = shards.ring_ranks(pattern)
        self.pos = rank % self.group
        self.base = rank - self.pos
        self.heads = heads
        self.dk, self.dv = dk, dv
        self.offsets = list(range(min(pattern.dilation, heads)))
        self._layouts: dict[int, list[BlockPart]] = {}

    def rank_of(self, pos: int) -> int:
        """The rank at ring position ``pos``."""
        return self.base + pos % self.group

    def pieces(self, pos: int) -> list[Piece]:
        """The pieces (chunks) of ring position ``pos``."""
        return self.shards.pieces(self.rank_of(pos))

    def rows(self, pos: int, piece: int, offset: int) -> slice:
        """Local rows of piece ``piece`` of ring position ``pos`` selected for head offset ``offset``."""
        pc = self.pieces(pos)[piece]
        sel = selected_rows(pc.start, pc.rows, self.pattern, offset)
        return slice(pc.row0 + sel.start, pc.row0 + pc.rows, sel.step)

    def heads_of(self, offset: int) -> slice:
        """Heads whose offset is ``offset``."""
        return slice(offset, self.heads, self.pattern.dilation)

    def nheads(self, offset: int) -> int:
        """Number of heads with offset ``offset``."""
        return len(range(offset, self.heads, self.pattern.dilation))

    def layout(self, pos: int) -> list[BlockPart]:
        """The parts of ring position ``pos``'s packed block: every head offset, then every piece."""
        pos %= self.group
        if pos in self._layouts:
            return self._layouts[pos]
        parts, cursor = [], 0
        npieces = len(self.pieces(pos))
        for i, o in enumerate(self.offsets):
            nh = self.nheads(o)
            for piece in range(npieces):
                m = count(self.rows(pos, piece, o))
                parts.append(BlockPart(i, o, piece, m, cursor, cursor + m * nh * self.dk))
                cursor += m * nh * (self.dk + self.dv)
        self._layouts[pos] = parts
        return parts

    def part(self, pos: int, index: int, piece: int) -> BlockPart:
        """The part of offset ``offsets[index]`` and piece ``piece`` in ring position ``pos``'s block."""
        return self.layout(pos)[index * len(self.pieces(pos)) + piece]

    def block_size(self, pos: int) -> int:
        """Elements of the packed block of ring position ``pos``."""
        return sum(p.rows * self.nheads(p.offset) * (self.dk + self.dv) for p in self.layout(pos))

    def pairs(self, pos: int, src: int, causal: bool) -> list[PiecePair]:
        """The (query piece, key piece) blocks ring position ``pos`` computes with ``src``'s block: pieces of one
        segment; under the causal mask only keys from earlier pieces, or the piece itself (its diagonal)."""
        w = self.pattern.segment
        out = []
        for qi, q in enumerate(self.pieces(pos)):
            for ki, k in enumerate(self.pieces(src)):
                if q.start // w != k.start // w or (causal and k.start > q.start):
                    continue
                out.append(PiecePair(qi, ki, 0 if (causal and k.start == q.start) else None))
        return out

    def schedule(self, causal: bool) -> list[tuple[int, bool, bool]]:
        """This rank's ring steps (:func:`ring_schedule`). A contiguous causal ring stops early; a zigzag ring
        always makes every step (each rank's second chunk needs the later ranks' blocks)."""
        return ring_schedule(self.pos, self.group, causal and self.shards.placement == "contiguous")

    def pack(self, ks: Array, vs: Array, out: Array) -> Array:
        """Copy this rank's selected K/V rows into the flat buffer ``out``; returns the used part."""
        for p in self.layout(self.pos):
            rows, hs = self.rows(self.pos, p.piece, p.offset), self.heads_of(p.offset)
            nh = self.nheads(p.offset)
            out[p.k0:p.k0 + p.rows * nh * self.dk].reshape(p.rows, nh, self.dk)[...] = ks[rows, hs]
            out[p.v0:p.v0 + p.rows * nh * self.dv].reshape(p.rows, nh, self.dv)[...] = vs[rows, hs]
        return out[: self.block_size(self.pos)]

    def unpack(self, block: Array, pos: int, index: int, piece: int) -> tuple[Array, Array]:
        """K (nh, m, dk) and V (nh, m, dv) views of one offset and piece inside a block of ring position
        ``pos`` (K/V, or an accumulator block of the same layout)."""
        p = self.part(pos, index, piece)
        nh = self.nheads(p.offset)
        k = block[p.k0:p.k0 + p.rows * nh * self.dk].reshape(p.rows, nh, self.dk).transpose(1, 0, 2)
        v = block[p.v0:p.v0 + p.rows * nh * self.dv].reshape(p.rows, nh, self.dv).transpose(1, 0, 2)
        return k, v


def ring_attention(qs: Array, ks: Array, vs: Array, geom: RingPattern, causal: bool, scale: float,
                   out: Array, lse: Array, comm: Any, transport: Any, tag: int,
                   attend_fn: AttendFn = attend, compute: bool = True, kernels: Any = None) -> RingStats:
    """One long pattern around its ring; merges into ``out``/``lse`` in place. Returns the counters.

    With ``compute=False`` only the blocks travel (the same schedule and sizes):
    the communication-only time that overlap is measured against.
    """
    xp = array_module(ks)
    stats = RingStats()
    g, pos = geom.group, geom.pos
    nxt, prv = geom.rank_of(pos + 1), geom.rank_of(pos - 1)
    size = max(geom.block_size(p) for p in range(g))
    bufs = [xp.empty(size, dtype=ks.dtype), xp.empty(size, dtype=ks.dtype)]

    t0 = time.perf_counter()
    cur = geom.pack(ks, vs, bufs[0])
    queries = {}          # (offset index, piece) -> queries heads first (nh, m, d)
    for p in geom.layout(pos) if (compute and kernels is None) else ():
        rows, hs = geom.rows(pos, p.piece, p.offset), geom.heads_of(p.offset)
        queries[p.index, p.piece] = xp.ascontiguousarray(qs[rows, hs].transpose(1, 0, 2))
    synchronize(xp)
    stats.pack_s += time.perf_counter() - t0

    for t, (src, send, recv) in enumerate(geom.schedule(causal)):
        incoming_pos = (src - 1) % g
        nxt_buf = bufs[(t + 1) % 2][: geom.block_size(incoming_pos)] if recv else None
        t_start = time.perf_counter()
        exchange = transport.start(cur if send else None, nxt, nxt_buf, prv, tag)
        if send:
            stats.bytes_sent += cur.size * cur.dtype.itemsize
            stats.messages += 1
        t1 = time.perf_counter()
        for pair in geom.pairs(pos, src, causal) if compute else ():
            if kernels is not None:
                kernels.ring_block(qs, cur, geom, pos, src, pair, scale, out, lse)
                continue
            for i, o in enumerate(geom.offsets):
                q = queries[i, pair.query]
                k, v = geom.unpack(cur, src, i, pair.key)
                if q.shape[1] == 0 or k.shape[1] == 0:
                    continue
                part_out, part_lse = attend_fn(q, xp.ascontiguousarray(k), xp.ascontiguousarray(v), scale,
                                               pair.shift)
                rows, hs = geom.rows(pos, pair.query, o), geom.heads_of(o)
                merge_lse(out[rows, hs], lse[rows, hs], part_out.transpose(1, 0, 2), part_lse.transpose(1, 0))
        if compute:
            progress_until_done(xp, [exchange])
        t2 = time.perf_counter()
        exchange.wait()
        t3 = time.perf_counter()
        stats.compute_s += t2 - t1
        stats.wait_s += (t1 - t_start) + (t3 - t2)
        stats.ring_steps += 1
        if recv:
            cur = nxt_buf
    return stats


def long_rings(patterns: Sequence[Pattern], shards: Shards, comm: Any, heads: int, dk: int, dv: int,
               barrier: RingStats | None) -> Iterator[tuple[int, RingPattern]]:
    """``(index, geometry)`` of each pattern of ``patterns`` that spans ranks, as this rank's
    :class:`RingPattern`. With ``barrier``, every rank first meets at a barrier, whose time is added to its
    ``imbalance_s`` (the load imbalance, kept out of the ring's waits)."""
    for i, p in enumerate(patterns):
        if p.segment <= shards.chunk:
            continue
        if barrier is not None:
            t0 = time.perf_counter()
            comm.Barrier()
            barrier.imbalance_s += time.perf_counter() - t0
        yield i, RingPattern(p, shards, comm.Get_rank(), heads, dk, dv)


def ring_dilated_attention(qs: Array, ks: Array, vs: Array, *, patterns: Sequence[Pattern], comm: Any,
                           causal: bool = False, scale: float | None = None, transport: Any = None,
                           attend_fn: AttendFn = attend, stats: RingStats | None = None,
                           sync_rings: bool = False, kernels: Any = None, placement: str = "contiguous") -> Array:
    """The output shard (L, H, Dv) of :func:`ring_dilated_forward`, without its log-sum-exp."""
    return ring_dilated_forward(qs, ks, vs, patterns=patterns, comm=comm, causal=causal, scale=scale,
                                transport=transport, attend_fn=attend_fn, stats=stats, sync_rings=sync_rings,
                                kernels=kernels, placement=placement)[0]


def ring_dilated_forward(qs: Array, ks: Array, vs: Array, *, patterns: Sequence[Pattern], comm: Any,
                         causal: bool = False, scale: float | None = None, transport: Any = None,
                         attend_fn: AttendFn = attend, stats: RingStats | None = None,
                         sync_rings: bool = False, kernels: Any = None,
                         placement: str = "contiguous") -> tuple[Array, Array]:
    """Dilated attention of this rank's serialized shard (L, H, D): its output shard (L, H, Dv) and merged
    log-sum-exp (L, H), the ``L`` that :func:`hilbert_hpc.distributed.ring_backward.ring_dilated_backward` needs.

    Every rank of ``comm`` calls this with its shard: the serialized positions that
    ``placement`` (:data:`hilbert_hpc.core.work.PLACEMENTS`) gives it, in the order of
    :meth:`~hilbert_hpc.distributed.sharding.Shards.pieces` (contiguous: rank ``p`` owns
    ``[p*L, (p+1)*L)``). Patterns must satisfy
    :func:`hilbert_hpc.distributed.sharding.check_distribution` for that placement. ``transport`` defaults to
    plain MPI on the arrays as given (host arrays, or a CUDA-aware MPI).
    Counters are added to ``stats`` when given. ``sync_rings`` puts a barrier
    before each ring (timing studies: waits then measure communication, and the
    barrier time, ``imbalance_s``, the load imbalance). ``kernels`` (a backend's
    ``ring_kernels``: ``accumulators``, ``local_patterns``, ``ring_block``) replaces ``attend_fn`` + merge
    with fused kernels.
    """
    import math

    from hilbert_hpc.distributed.transports import HostTransport

    xp = array_module(qs)
    shard, heads, dk = qs.shape
    dv = vs.shape[-1]
    scale = 1.0 / math.sqrt(dk) if scale is None else scale
    transport = transport or HostTransport(comm)
    stats = stats if stats is not None else RingStats()
    shards = Shards(shard * comm.Get_size(), comm.Get_size(), placement)
    if kernels is not None:
        out, lse = kernels.accumulators(xp, shard, heads, dv, qs.dtype)   # the kernels' own output dtype
    else:
        out, lse = empty_accumulators(xp, shard, heads, dv, qs.dtype)
    local = [p for p in patterns if p.segment <= shards.chunk]
    t0 = time.perf_counter()
    if local and kernels is not None:
        kernels.local_patterns(qs, ks, vs, local, causal, scale, out, lse)
    elif local:
        accumulate_patterns(qs, ks, vs, local, causal, scale, out, lse, attend_fn)
    synchronize(xp)
    stats.local_s += time.perf_counter() - t0
    for i, geom in long_rings(patterns, shards, comm, heads, dk, dv, stats if sync_rings else None):
        stats.add(ring_attention(qs, ks, vs, geom, causal, scale, out, lse, comm, transport, tag=100 + i,
                                 attend_fn=attend_fn, kernels=kernels))
    return out, lse


def ring_transfer_only(ks: Array, vs: Array, *, patterns: Sequence[Pattern], comm: Any, causal: bool,
                       transport: Any, placement: str = "contiguous") -> RingStats:
    """Move the K/V blocks of every long pattern exactly as the ring does, without computing.

    ``wait_s`` of the result is then the time in the transfers themselves (packing excluded).
    """
    shard, heads, dk = ks.shape
    shards = Shards(shard * comm.Get_size(), comm.Get_size(), placement)
    stats = RingStats()
    for i, geom in long_rings(patterns, shards, comm, heads, dk, vs.shape[-1], RingStats()):
        stats.add(ring_attention(ks, ks, vs, geom, causal, 1.0, None, None, comm, transport, tag=100 + i,
                                 compute=False))
    return stats

