"""Distributed dilated attention: local patterns in place, long patterns around rings of ranks.

Each rank holds one serialized shard of Q, K, V (``L`` rows). Patterns whose
segments fit in a shard are computed locally. For a pattern spanning ``g``
ranks, each rank packs the selected K/V rows of its shard for every head offset
into one buffer (``~L/r`` rows: traffic divided by the dilation) and the buffers
rotate around the ring with ``Isend``/``Irecv``: the next block is in flight while
the current one is attended to. Partial results merge by log-sum-exp. In a
causal ring a rank only needs blocks from ranks before it, so blocks stop
travelling once nobody downstream needs them.

The compute side works on any NumPy-like array module (NumPy, CuPy).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

from hilbert_hpc.core.blockwise import array_module, attend, merge_lse
from hilbert_hpc.core.dilated import AttendFn, accumulate_patterns, empty_accumulators
from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.distributed.sharding import count, selected_rows

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


def _sync(xp: Any) -> None:
    if xp.__name__ == "cupy":
        xp.cuda.get_current_stream().synchronize()


def _progress_until_done(xp: Any, exchange: Any) -> None:
    """Wait for queued GPU work while driving MPI progress, so transfers advance during compute."""
    if xp.__name__ != "cupy":
        return
    done = xp.cuda.get_current_stream().record()
    while not done.done:
        exchange.test()


class RingPattern:
    """Packing geometry of one long pattern for every rank position of its ring."""

    def __init__(self, pattern: Pattern, shard: int, heads: int, dk: int, dv: int) -> None:
        self.pattern = pattern
        self.shard = shard
        self.group = pattern.segment // shard
        self.heads = heads
        self.dk, self.dv = dk, dv
        self.offsets = list(range(min(pattern.dilation, heads)))

    def rows(self, pos: int, offset: int) -> slice:
        """Selected local rows of ring position ``pos`` for head offset ``offset``."""
        return selected_rows(pos * self.shard, self.shard, self.pattern, offset)

    def heads_of(self, offset: int) -> slice:
        """Heads whose offset is ``offset``."""
        return slice(offset, self.heads, self.pattern.dilation)

    def nheads(self, offset: int) -> int:
        """Number of heads with offset ``offset``."""
        return len(range(offset, self.heads, self.pattern.dilation))

    def layout(self, pos: int) -> list[tuple[int, int, int, int]]:
        """``(offset, rows, k_start, v_start)`` of each offset's K and V inside a packed block."""
        parts, cursor = [], 0
        for o in self.offsets:
            m, nh = count(self.rows(pos, o)), self.nheads(o)
            parts.append((o, m, cursor, cursor + m * nh * self.dk))
            cursor += m * nh * (self.dk + self.dv)
        return parts

    def block_size(self, pos: int) -> int:
        """Elements of the packed block of ring position ``pos``."""
        return sum(count(self.rows(pos, o)) * self.nheads(o) * (self.dk + self.dv) for o in self.offsets)

    def pack(self, ks: Array, vs: Array, pos: int, out: Array) -> Array:
        """Copy the selected K/V rows of this shard into the flat buffer ``out``; returns the used part."""
        for o, m, k0, v0 in self.layout(pos):
            rows, hs = self.rows(pos, o), self.heads_of(o)
            nh = self.nheads(o)
            out[k0:k0 + m * nh * self.dk].reshape(m, nh, self.dk)[...] = ks[rows, hs]
            out[v0:v0 + m * nh * self.dv].reshape(m, nh, self.dv)[...] = vs[rows, hs]
        return out[: self.block_size(pos)]

    def unpack(self, block: Array, pos: int, offset_index: int) -> tuple[Array, Array]:
        """K (nh, m, dk) and V (nh, m, dv) views of one offset inside a received block."""
        o, m, k0, v0 = self.layout(pos)[offset_index]
        nh = self.nheads(o)
        k = block[k0:k0 + m * nh * self.dk].reshape(m, nh, self.dk).transpose(1, 0, 2)
        v = block[v0:v0 + m * nh * self.dv].reshape(m, nh, self.dv).transpose(1, 0, 2)
        return k, v


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


def ring_attention(qs: Array, ks: Array, vs: Array, geom: RingPattern, causal: bool, scale: float,
                   out: Array, lse: Array, comm: Any, transport: Any, tag: int,
                   attend_fn: AttendFn = attend, compute: bool = True, kernels: Any = None) -> RingStats:
    """One long pattern around its ring; merges into ``out``/``lse`` in place. Returns the counters.

    With ``compute=False`` only the blocks travel (the same schedule and sizes):
    the communication-only time that overlap is measured against.
    """
    xp = array_module(ks)
    stats = RingStats()
    rank = comm.Get_rank()
    g = geom.group
    pos = rank % g
    base = rank - pos
    nxt, prv = base + (pos + 1) % g, base + (pos - 1) % g
    size = max(geom.block_size(p) for p in range(g))
    bufs = [xp.empty(size, dtype=ks.dtype), xp.empty(size, dtype=ks.dtype)]

    t0 = time.perf_counter()
    cur = geom.pack(ks, vs, pos, bufs[0])
    queries = []
    for o in geom.offsets if (compute and kernels is None) else ():
        rows, hs = geom.rows(pos, o), geom.heads_of(o)
        queries.append(xp.ascontiguousarray(qs[rows, hs].transpose(1, 0, 2)))
    _sync(xp)
    stats.pack_s += time.perf_counter() - t0

    schedule = ring_schedule(pos, g, causal)
    for t, (src, send, recv) in enumerate(schedule):
        incoming_pos = (src - 1) % g
        nxt_buf = bufs[(t + 1) % 2][: geom.block_size(incoming_pos)] if recv else None
        t_start = time.perf_counter()
        exchange = transport.start(cur if send else None, nxt, nxt_buf, prv, tag)
        if send:
            stats.bytes_sent += cur.size * cur.dtype.itemsize
            stats.messages += 1
        t1 = time.perf_counter()
        if compute and kernels is not None:
            kernels.ring_block(qs, cur, geom, pos, src, 0 if (causal and src == pos) else None, scale, out, lse)
        elif compute:
            shift = 0 if (causal and src == pos) else None
            for i, o in enumerate(geom.offsets):
                q = queries[i]
                if q.shape[1] == 0:
                    continue
                k, v = geom.unpack(cur, src, i)
                if k.shape[1] == 0:
                    continue
                part_out, part_lse = attend_fn(q, xp.ascontiguousarray(k), xp.ascontiguousarray(v), scale, shift)
                rows, hs = geom.rows(pos, o), geom.heads_of(o)
                merge_lse(out[rows, hs], lse[rows, hs], part_out.transpose(1, 0, 2), part_lse.transpose(1, 0))
        if compute:
            _progress_until_done(xp, exchange)
        t2 = time.perf_counter()
        exchange.wait()
        t3 = time.perf_counter()
        stats.compute_s += t2 - t1
        stats.wait_s += (t1 - t_start) + (t3 - t2)
        stats.ring_steps += 1
        if recv:
            cur = nxt_buf
    return stats


def ring_dilated_attention(qs: Array, ks: Array, vs: Array, *, patterns: Sequence[Pattern], comm: Any,
                           causal: bool = False, scale: float | None = None, transport: Any = None,
                           attend_fn: AttendFn = attend, stats: RingStats | None = None,
                           sync_rings: bool = False, kernels: Any = None) -> Array:
    """The output shard (L, H, Dv) of :func:`ring_dilated_forward`, without its log-sum-exp."""
    return ring_dilated_forward(qs, ks, vs, patterns=patterns, comm=comm, causal=causal, scale=scale,
                                transport=transport, attend_fn=attend_fn, stats=stats, sync_rings=sync_rings,
                                kernels=kernels)[0]


def ring_dilated_forward(qs: Array, ks: Array, vs: Array, *, patterns: Sequence[Pattern], comm: Any,
                         causal: bool = False, scale: float | None = None, transport: Any = None,
                         attend_fn: AttendFn = attend, stats: RingStats | None = None,
                         sync_rings: bool = False, kernels: Any = None) -> tuple[Array, Array]:
    """Dilated attention of this rank's serialized shard (L, H, D): its output shard (L, H, Dv) and merged
    log-sum-exp (L, H), the ``L`` that :func:`hilbert_hpc.distributed.ring_backward.ring_dilated_backward` needs.

    Every rank of ``comm`` calls this with its shard (rank ``p`` owns serialized
    positions ``[p*L, (p+1)*L)``). Patterns must satisfy
    :func:`hilbert_hpc.distributed.sharding.check_distribution`. ``transport`` defaults to
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
    if kernels is not None:
        out, lse = kernels.accumulators(xp, shard, heads, dv, qs.dtype)   # the kernels' own output dtype
    else:
        out, lse = empty_accumulators(xp, shard, heads, dv, qs.dtype)
    local = [p for p in patterns if p.segment <= shard]
    t0 = time.perf_counter()
    if local and kernels is not None:
        kernels.local_patterns(qs, ks, vs, local, causal, scale, out, lse)
    elif local:
        accumulate_patterns(qs, ks, vs, local, causal, scale, out, lse, attend_fn)
    _sync(xp)
    stats.local_s += time.perf_counter() - t0
    for i, p in enumerate(patterns):
        if p.segment > shard:
            geom = RingPattern(p, shard, heads, dk, dv)
            if sync_rings:
                t1 = time.perf_counter()
                comm.Barrier()
                stats.imbalance_s += time.perf_counter() - t1
            stats.add(ring_attention(qs, ks, vs, geom, causal, scale, out, lse, comm, transport, tag=100 + i,
                                     attend_fn=attend_fn, kernels=kernels))
    return out, lse


def ring_transfer_only(ks: Array, vs: Array, *, patterns: Sequence[Pattern], comm: Any, causal: bool,
                       transport: Any) -> RingStats:
    """Move the K/V blocks of every long pattern exactly as the ring does, without computing.

    ``wait_s`` of the result is then the time in the transfers themselves (packing excluded).
    """
    shard, heads, dk = ks.shape
    stats = RingStats()
    for i, p in enumerate(patterns):
        if p.segment > shard:
            comm.Barrier()
            geom = RingPattern(p, shard, heads, dk, vs.shape[-1])
            stats.add(ring_attention(ks, ks, vs, geom, causal, 1.0, None, None, comm, transport, tag=100 + i,
                                     compute=False))
    return stats

