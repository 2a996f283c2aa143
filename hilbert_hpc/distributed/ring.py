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
from functools import lru_cache
from typing import Any, Iterator, Sequence

import numpy as np

from hilbert_hpc.core.blockwise import array_module, attend, merge_lse
from hilbert_hpc.core.dilated import AttendFn, accumulate_patterns, empty_accumulators
from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.distributed.providers import ForwardProvider
from hilbert_hpc.distributed.schedule import schedule_kinds
from hilbert_hpc.distributed.sharding import Piece, Shards, count, selected_rows
from hilbert_hpc.distributed.timeline import OFF

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
        self._sizes: dict[int, int] = {}
        self._pairs: dict[tuple[int, int, bool], tuple[PiecePair, ...]] = {}
        self._index: dict[str, Array] = {}

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
        """The parts of ring position ``pos``'s packed block, every head offset then every piece: all their K rows
        first, then all their V rows (so that packing is one gather of K rows and one of V rows)."""
        pos %= self.group
        if pos in self._layouts:
            return self._layouts[pos]
        npieces = len(self.pieces(pos))
        counts = [(i, o, piece, count(self.rows(pos, piece, o)), self.nheads(o))
                  for i, o in enumerate(self.offsets) for piece in range(npieces)]
        v_start = sum(m * nh for *_, m, nh in counts) * self.dk
        parts, k_cursor, v_cursor = [], 0, v_start
        for i, o, piece, m, nh in counts:
            parts.append(BlockPart(i, o, piece, m, k_cursor, v_cursor))
            k_cursor += m * nh * self.dk
            v_cursor += m * nh * self.dv
        self._layouts[pos] = parts
        return parts

    def part(self, pos: int, index: int, piece: int) -> BlockPart:
        """The part of offset ``offsets[index]`` and piece ``piece`` in ring position ``pos``'s block."""
        return self.layout(pos)[index * len(self.pieces(pos)) + piece]

    def block_size(self, pos: int) -> int:
        """Elements of the packed block of ring position ``pos`` (worked out once per position)."""
        pos %= self.group
        if pos not in self._sizes:
            self._sizes[pos] = sum(p.rows * self.nheads(p.offset) * (self.dk + self.dv) for p in self.layout(pos))
        return self._sizes[pos]

    def pairs(self, pos: int, src: int, causal: bool) -> tuple[PiecePair, ...]:
        """The (query piece, key piece) blocks ring position ``pos`` computes with ``src``'s block: pieces of one
        segment; under the causal mask only keys from earlier pieces, or the piece itself (its diagonal). Worked
        out once per (pos, src, causal): every hop asks."""
        key = (pos % self.group, src % self.group, bool(causal))
        if key not in self._pairs:
            w = self.pattern.segment
            out = []
            for qi, q in enumerate(self.pieces(pos)):
                for ki, k in enumerate(self.pieces(src)):
                    if q.start // w != k.start // w or (causal and k.start > q.start):
                        continue
                    out.append(PiecePair(qi, ki, 0 if (causal and k.start == q.start) else None))
            self._pairs[key] = tuple(out)
        return self._pairs[key]

    def schedule(self, causal: bool) -> list[tuple[int, bool, bool]]:
        """This rank's ring steps (:func:`ring_schedule`). A contiguous causal ring stops early; a zigzag ring
        always makes every step (each rank's second chunk needs the later ranks' blocks)."""
        return ring_schedule(self.pos, self.group, causal and self.shards.placement == "contiguous")

    def pack(self, ks: Array, vs: Array, out: Array) -> Array:
        """Copy this rank's selected K/V rows into the flat buffer ``out``; returns the used part. Two gathers of
        (row, head) vectors, by an index made once per array module (:meth:`pack_index`)."""
        xp = array_module(ks)
        index = self.pack_index(xp)
        nk = index.size * self.dk
        block = out[: self.block_size(self.pos)]
        xp.take(ks.reshape(-1, self.dk), index, axis=0, out=block[:nk].reshape(-1, self.dk))
        xp.take(vs.reshape(-1, self.dv), index, axis=0, out=block[nk:].reshape(-1, self.dv))
        return block

    def pack_index(self, xp: Any) -> Array:
        """The (row, head) vectors of this rank's block in order (row * heads + head of the shard), as an array
        of ``xp``, made once per module."""
        if xp.__name__ not in self._index:
            h = self.heads
            rows = [np.arange(r.start, r.stop, r.step)[:, None] * h + np.arange(h)[self.heads_of(p.offset)]
                    for p in self.layout(self.pos) for r in [self.rows(self.pos, p.piece, p.offset)]]
            flat = np.concatenate([x.reshape(-1) for x in rows]) if rows else np.zeros(0, dtype=np.int64)
            self._index[xp.__name__] = xp.asarray(flat.astype(np.int64))
        return self._index[xp.__name__]

    def unpack(self, block: Array, pos: int, index: int, piece: int) -> tuple[Array, Array]:
        """K (nh, m, dk) and V (nh, m, dv) views of one offset and piece inside a block of ring position
        ``pos`` (K/V, or an accumulator block of the same layout)."""
        p = self.part(pos, index, piece)
        nh = self.nheads(p.offset)
        k = block[p.k0:p.k0 + p.rows * nh * self.dk].reshape(p.rows, nh, self.dk).transpose(1, 0, 2)
        v = block[p.v0:p.v0 + p.rows * nh * self.dv].reshape(p.rows, nh, self.dv).transpose(1, 0, 2)
        return k, v


class HostBlockForward:
    """The forward provider built on a block attention function (``AttendFn``, heads-first arrays): gathers each
    block's rows, calls it, and merges the result by log-sum-exp in place. Works on any NumPy-like module (the
    fused kernels' providers have the same methods: ``kernels.launch.FusedKernels``)."""

    def __init__(self, attend_fn: AttendFn = attend) -> None:
        self.attend_fn = attend_fn

    def accumulators(self, xp: Any, n: int, heads: int, dv: int, dtype: Any) -> tuple[Array, Array]:
        """Running output zeros (n, H, Dv) and log-sum-exp -inf (n, H) in the accumulator dtype of ``dtype``."""
        return empty_accumulators(xp, n, heads, dv, dtype)

    def local_patterns(self, qs: Array, ks: Array, vs: Array, patterns: Sequence[Pattern], causal: bool,
                       scale: float, out: Array, lse: Array) -> None:
        """Patterns whose segments lie inside the shard, merged into ``out``/``lse``."""
        accumulate_patterns(qs, ks, vs, patterns, causal, scale, out, lse, self.attend_fn)

    def _merge(self, qs: Array, k: Array, v: Array, rows: slice, hs: slice, shift: int | None, scale: float,
               out: Array, lse: Array) -> None:
        """Queries ``qs[rows, hs]`` against heads-first ``k``/``v``, merged into their rows of ``out``/``lse``."""
        xp = array_module(qs)
        q = xp.ascontiguousarray(qs[rows, hs].transpose(1, 0, 2))
        if q.shape[1] == 0 or k.shape[1] == 0:
            return
        part_out, part_lse = self.attend_fn(q, xp.ascontiguousarray(k), xp.ascontiguousarray(v), scale, shift)
        merge_lse(out[rows, hs], lse[rows, hs], part_out.transpose(1, 0, 2), part_lse.transpose(1, 0))

    def ring_block(self, qs: Array, block: Array, geom: "RingPattern", pos: int, src: int, pair: "PiecePair",
                   scale: float, out: Array, lse: Array) -> None:
        """This rank's selected queries of piece ``pair.query`` against piece ``pair.key`` of ``src``'s packed
        block, merged in place."""
        for i, o in enumerate(geom.offsets):
            k, v = geom.unpack(block, src, i, pair.key)
            self._merge(qs, k, v, geom.rows(pos, pair.query, o), geom.heads_of(o), pair.shift, scale, out, lse)

    def gathered(self, qs: Array, sequence: Array, gather: Any, scale: float, out: Array, lse: Array) -> None:
        """This rank's selected queries against a gathered pattern's rows in sequence order
        (``distributed.gather.GatherPattern``), merged in place."""
        for _, region, rows, _, mk, shift in gather.problems():
            k, v = gather.keys(sequence, region, mk)
            self._merge(qs, k, v, rows, gather.ring.heads_of(region.offset), shift, scale, out, lse)


def ring_attention(qs: Array, ks: Array, vs: Array, geom: RingPattern, causal: bool, scale: float,
                   out: Array, lse: Array, comm: Any, transport: Any, tag: int,
                   kernels: ForwardProvider | None = None, compute: bool = True, timeline: Any = OFF) -> RingStats:
    """One long pattern around its ring; merges into ``out``/``lse`` in place with the forward provider
    ``kernels`` (:class:`HostBlockForward` or a backend's fused kernels). Returns the counters.

    With ``compute=False`` only the blocks travel (the same schedule and sizes):
    the communication-only time that overlap is measured against. ``timeline``: a
    :class:`~hilbert_hpc.distributed.timeline.Timeline` that gets a mark at each phase of each hop.
    """
    xp = array_module(ks)
    stats = RingStats()
    g, pos = geom.group, geom.pos
    nxt, prv = geom.rank_of(pos + 1), geom.rank_of(pos - 1)
    size = max(geom.block_size(p) for p in range(g))
    bufs = [xp.empty(size, dtype=ks.dtype), xp.empty(size, dtype=ks.dtype)]

    t0 = time.perf_counter()
    cur = geom.pack(ks, vs, bufs[0])
    synchronize(xp)
    stats.pack_s += time.perf_counter() - t0
    timeline.mark("ring: packed", xp)

    for t, (src, send, recv) in enumerate(geom.schedule(causal)):
        incoming_pos = (src - 1) % g
        nxt_buf = bufs[(t + 1) % 2][: geom.block_size(incoming_pos)] if recv else None
        t_start = time.perf_counter()
        exchange = transport.start(cur if send else None, nxt, nxt_buf, prv, tag)
        if send:
            stats.bytes_sent += cur.size * cur.dtype.itemsize
            stats.messages += 1
        t1 = time.perf_counter()
        timeline.mark(f"hop {t}: posted", xp)
        for pair in geom.pairs(pos, src, causal) if compute else ():
            kernels.ring_block(qs, cur, geom, pos, src, pair, scale, out, lse)
        timeline.mark(f"hop {t}: launched", xp)
        if compute:
            progress_until_done(xp, [exchange])
        t2 = time.perf_counter()
        timeline.mark(f"hop {t}: computed", xp)
        exchange.wait()
        t3 = time.perf_counter()
        timeline.mark(f"hop {t}: received", xp)
        stats.compute_s += t2 - t1
        stats.wait_s += (t1 - t_start) + (t3 - t2)
        stats.ring_steps += 1
        if recv:
            cur = nxt_buf
    return stats


def long_rings(patterns: Sequence[Pattern], shards: Shards, comm: Any, heads: int, dk: int, dv: int,
               barrier: RingStats | None, kinds: dict[int, str] | None = None) -> Iterator[tuple[int, RingPattern]]:
    """``(index, geometry)`` of each pattern of ``patterns`` that spans ranks, as this rank's
    :class:`RingPattern`; with ``kinds`` (``distributed.schedule.schedule_kinds``) only those whose schedule is
    ``ring``. With ``barrier``, every rank first meets at a barrier, whose time is added to its
    ``imbalance_s`` (the load imbalance, kept out of the ring's waits)."""
    for i, p in enumerate(patterns):
        if p.segment <= shards.chunk or (kinds is not None and kinds.get(i) != "ring"):
            continue
        if barrier is not None:
            t0 = time.perf_counter()
            comm.Barrier()
            barrier.imbalance_s += time.perf_counter() - t0
        yield i, ring_geometry(p, shards, comm.Get_rank(), heads, dk, dv)


@lru_cache(maxsize=64)
def ring_geometry(pattern: Pattern, shards: Shards, rank: int, heads: int, dk: int, dv: int) -> RingPattern:
    """The :class:`RingPattern` of ``pattern`` on ``rank``, made once per case (its layouts and pack index are
    then reused by every call)."""
    return RingPattern(pattern, shards, rank, heads, dk, dv)


@lru_cache(maxsize=64)
def gather_geometry(pattern: Pattern, shards: Shards, rank: int, heads: int, dk: int, dv: int, causal: bool) -> Any:
    """The ``distributed.gather.GatherPattern`` of ``pattern`` on ``rank``, made once per case."""
    from hilbert_hpc.distributed.gather import GatherPattern

    return GatherPattern(ring_geometry(pattern, shards, rank, heads, dk, dv), causal)


def gather_patterns(patterns: Sequence[Pattern], shards: Shards, rank: int, heads: int, dk: int, dv: int,
                    causal: bool, kinds: dict[int, str]) -> list[tuple[int, Any]]:
    """``(index, distributed.gather.GatherPattern)`` of each long pattern whose schedule is ``gather``."""
    return [(i, gather_geometry(p, shards, rank, heads, dk, dv, causal)) for i, p in enumerate(patterns)
            if kinds.get(i) == "gather"]


def post_gathers(ks: Array, vs: Array, gathers: Sequence[tuple[int, Any]], transport: Any, tag0: int,
                 stats: RingStats) -> list[tuple[int, Any, Array, Any]]:
    """Pack this rank's block of each gathered pattern into its slot of a rank-order buffer and post the
    exchanges (tag ``tag0 + index``); returns ``(index, gather, buffer, exchange)`` each."""
    xp = array_module(ks)
    t0 = time.perf_counter()
    posted = []
    for i, gp in gathers:
        buf = xp.empty(gp.total, dtype=ks.dtype)
        gp.ring.pack(ks, vs, gp.block(buf, gp.ring.pos))
        posted.append((i, gp, buf, gp.start_gather(buf, transport, tag0 + i)))
        stats.bytes_sent += len(gp.targets) * gp.sizes[gp.ring.pos] * buf.dtype.itemsize
        stats.messages += len(gp.targets)
    stats.pack_s += time.perf_counter() - t0
    return posted


def finish_gathers(posted: Sequence[tuple[int, Any, Array, Any]], stats: RingStats) -> dict[int, tuple[Any, Array]]:
    """Wait for each posted gather (``wait_s``) and put its rows in sequence order (``compute_s``):
    ``{index: (gather, sequence buffer)}``."""
    out = {}
    for i, gp, buf, exchange in posted:
        t0 = time.perf_counter()
        exchange.wait()
        t1 = time.perf_counter()
        stats.wait_s += t1 - t0
        xp = array_module(buf)
        out[i] = (gp, gp.to_sequence(buf, xp.empty(gp.sequence_elements, dtype=buf.dtype)))
        stats.compute_s += time.perf_counter() - t1
    return out


def meet(comm: Any, stats: RingStats, when: bool) -> None:
    """A barrier whose time is this rank's load imbalance (``imbalance_s``), when ``when``."""
    if when:
        t0 = time.perf_counter()
        comm.Barrier()
        stats.imbalance_s += time.perf_counter() - t0


def ring_dilated_attention(qs: Array, ks: Array, vs: Array, *, patterns: Sequence[Pattern], comm: Any,
                           causal: bool = False, scale: float | None = None, transport: Any = None,
                           attend_fn: AttendFn = attend, stats: RingStats | None = None,
                           sync_rings: bool = False, kernels: Any = None, placement: str = "contiguous",
                           schedule: Any = "auto") -> Array:
    """The output shard (L, H, Dv) of :func:`ring_dilated_forward`, without its log-sum-exp."""
    return ring_dilated_forward(qs, ks, vs, patterns=patterns, comm=comm, causal=causal, scale=scale,
                                transport=transport, attend_fn=attend_fn, stats=stats, sync_rings=sync_rings,
                                kernels=kernels, placement=placement, schedule=schedule)[0]


def ring_dilated_forward(qs: Array, ks: Array, vs: Array, *, patterns: Sequence[Pattern], comm: Any,
                         causal: bool = False, scale: float | None = None, transport: Any = None,
                         attend_fn: AttendFn = attend, stats: RingStats | None = None,
                         sync_rings: bool = False, kernels: ForwardProvider | None = None,
                         placement: str = "contiguous", schedule: Any = "auto",
                         gathered: dict | None = None, timeline: Any = OFF) -> tuple[Array, Array]:
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
    barrier time, ``imbalance_s``, the load imbalance). ``kernels`` is the forward provider (a backend's
    ``ring_kernels``: fused kernels), by default :class:`HostBlockForward` of ``attend_fn``.
    ``schedule``: how each long pattern moves its rows (``distributed.schedule``): a name of ``SCHEDULES``,
    decided here, or a case's decided ``LongSchedule`` sequence. The gathered patterns' exchanges are posted
    before the local patterns run; ``gathered``, a dict, receives their rows in sequence order, which
    ``ring_dilated_backward`` then reuses instead of gathering again. ``timeline``: a
    :class:`~hilbert_hpc.distributed.timeline.Timeline` marked at each phase (where a long pattern's time goes).
    """
    import math

    from hilbert_hpc.distributed.transports import HostTransport

    xp = array_module(qs)
    shard, heads, dk = qs.shape
    dv = vs.shape[-1]
    scale = 1.0 / math.sqrt(dk) if scale is None else scale
    transport = transport or HostTransport(comm)
    stats = stats if stats is not None else RingStats()
    kernels = kernels if kernels is not None else HostBlockForward(attend_fn)
    shards = Shards(shard * comm.Get_size(), comm.Get_size(), placement)
    kinds = schedule_kinds(schedule, patterns, shards, heads, dk, dv, ks.dtype.itemsize, False)
    timeline.mark("start", xp)
    out, lse = kernels.accumulators(xp, shard, heads, dv, qs.dtype)
    timeline.mark("accumulators", xp)
    gathers = gather_patterns(patterns, shards, comm.Get_rank(), heads, dk, dv, causal, kinds)
    posted = post_gathers(ks, vs, gathers, transport, 100, stats)
    timeline.mark("gathers packed and posted", xp)
    local = [p for p in patterns if p.segment <= shards.chunk]
    t0 = time.perf_counter()
    if local:
        kernels.local_patterns(qs, ks, vs, local, causal, scale, out, lse)
    timeline.mark("local patterns launched", xp)
    progress_until_done(xp, [p[3] for p in posted])
    synchronize(xp)
    stats.local_s += time.perf_counter() - t0
    timeline.mark("local patterns done", xp)
    meet(comm, stats, sync_rings and bool(posted))
    rows = finish_gathers(posted, stats)
    timeline.mark("gathers received, in order", xp)
    t1 = time.perf_counter()
    for gp, sequence in rows.values():
        kernels.gathered(qs, sequence, gp, scale, out, lse)
    timeline.mark("gathered patterns launched", xp)
    synchronize(xp)
    stats.compute_s += time.perf_counter() - t1
    timeline.mark("gathered patterns done", xp)
    if gathered is not None:
        gathered.update(rows)
    del rows
    for i, geom in long_rings(patterns, shards, comm, heads, dk, dv, stats if sync_rings else None, kinds):
        stats.add(ring_attention(qs, ks, vs, geom, causal, scale, out, lse, comm, transport, tag=100 + i,
                                 kernels=kernels, timeline=timeline))
    return out, lse


def ring_transfer_only(ks: Array, vs: Array, *, patterns: Sequence[Pattern], comm: Any, causal: bool,
                       transport: Any, placement: str = "contiguous", schedule: Any = "auto") -> RingStats:
    """Move the K/V blocks of every long pattern exactly as the forward does, without computing.

    ``wait_s`` of the result is then the time in the transfers themselves (packing excluded).
    """
    shard, heads, dk = ks.shape
    dv = vs.shape[-1]
    shards = Shards(shard * comm.Get_size(), comm.Get_size(), placement)
    kinds = schedule_kinds(schedule, patterns, shards, heads, dk, dv, ks.dtype.itemsize, False)
    stats = RingStats()
    gathers = gather_patterns(patterns, shards, comm.Get_rank(), heads, dk, dv, causal, kinds)
    meet(comm, RingStats(), bool(gathers))
    finish_gathers(post_gathers(ks, vs, gathers, transport, 100, RingStats()), stats)
    for i, geom in long_rings(patterns, shards, comm, heads, dk, dv, RingStats(), kinds):
        stats.add(ring_attention(ks, ks, vs, geom, causal, 1.0, None, None, comm, transport, tag=100 + i,
                                 compute=False))
    return stats
