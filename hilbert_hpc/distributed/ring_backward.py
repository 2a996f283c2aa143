"""Exact backward of distributed dilated attention: dK/dV accumulators ride the K/V ring and come home.

docs/semantics.md, section 10 (its ring paragraph). Local patterns are
differentiated in place on the shard. For a pattern spanning a ring the packed
K/V blocks rotate exactly as in the forward (:meth:`hilbert_hpc.distributed.ring.RingPattern.schedule`:
position ``p`` sends to ``p + 1``). Next to each K/V block travels an accumulator
block of the same layout (``dK`` rows then ``dV`` rows of every head offset and
piece, in the accumulator dtype): every rank the block visits adds the terms of
its own selected queries (against the merged ``L`` and ``delta = rowsum(dO * O)``)
and forwards it to ``p + 1``. The accumulators always make the full ring, so
after the last step each one arrives at its owner (one more exchange with the
same neighbours) and is added into the owner's dK/dV rows. In a contiguous
causal ring the K/V blocks stop travelling as in the forward; the accumulators
keep going to get home, and positions after the last one that needs a block only
relay its accumulator. dQ never leaves the rank.

The accumulator exchange overlaps the compute: at step ``t`` a rank adds its
terms of the block in hand into a zeroed ``partial`` block while the
accumulator of that block (completed by the previous rank at step ``t - 1``) is
on its way in and the one this rank completed at step ``t - 1`` is on its way
out, next to the K/V exchange of step ``t + 1``'s block; once both have arrived
the partial terms are added to the incoming accumulator. The two exchanges use
different tags (and, staged, different pinned buffers).

The block terms come from a provider (``kernels``): :class:`HostBlockBackward`
wraps a block backward function on NumPy-like arrays (the default,
:func:`hilbert_hpc.core.backward.attend_backward`); a backend's GPU provider
launches its kernels on the packed blocks in place. A provider has
``accumulator_dtype``, ``row_delta``, ``local_backward`` and ``ring_block``
(those of :class:`HostBlockBackward`).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

from hilbert_hpc.core.backward import Grads, attend_backward, local_dilated_backward, row_delta
from hilbert_hpc.core.blockwise import accumulator_dtype, array_module
from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.distributed.ring import (PiecePair, RingPattern, RingStats, finish_gathers, gather_patterns,
                                         long_rings, meet, post_gathers, progress_until_done,
                                         synchronize)
from hilbert_hpc.distributed.providers import BackwardProvider
from hilbert_hpc.distributed.schedule import schedule_kinds
from hilbert_hpc.distributed.sharding import Shards

Array = Any

#: ``(q, k, v, lse, delta, dout, scale, causal_shift) -> (dq, dk, dv)`` of one block, as
#: :func:`hilbert_hpc.core.backward.attend_backward`.
BackwardFn = Callable[..., Grads]


class HostBlockBackward:
    """The ring backward's provider built on a block backward function (``BackwardFn``) of heads-first arrays:
    gathers each block's rows, calls it, and adds its terms in place. Works on any NumPy-like module."""

    def __init__(self, backward_fn: BackwardFn = attend_backward) -> None:
        self.backward_fn = backward_fn

    def accumulator_dtype(self, dtype: Any) -> Any:
        """dtype of the gradients and of the accumulator blocks for inputs of ``dtype``."""
        return accumulator_dtype(dtype)

    def row_delta(self, dout: Array, out: Array) -> Array:
        """``delta = rowsum(dO * O)`` (L, H) of the shard, in the accumulator dtype of ``dout``."""
        return row_delta(dout, out, accumulator_dtype(dout.dtype))

    def local_backward(self, qs: Array, ks: Array, vs: Array, out: Array, lse: Array, dout: Array, delta: Array,
                       patterns: Sequence[Pattern], causal: bool, scale: float, into: Grads | None = None) -> Grads:
        """Gradients (dQ, dK, dV) of the shard's local patterns, in the accumulator dtype (zeros without any);
        added into ``into`` when given (returned)."""
        grads = local_dilated_backward(qs, ks, vs, out, lse, dout, patterns, causal, scale, delta)
        if into is None:
            return grads
        if patterns:
            for total, g in zip(into, grads):
                total += g
        return into

    def ring_block(self, qs: Array, dout: Array, lse: Array, delta: Array, block: Array, partial: Array,
                   geom: RingPattern, pos: int, src: int, pair: PiecePair, scale: float, dq: Array) -> None:
        """Terms of this rank's queries of piece ``pair.query`` against piece ``pair.key`` of ``src``'s K/V
        ``block``: dQ added into the shard's ``dq`` (L, H, D), dK/dV into the accumulator block ``partial``."""
        xp = array_module(qs)
        for i, o in enumerate(geom.offsets):
            rows, hs = geom.rows(pos, pair.query, o), geom.heads_of(o)
            k, v = geom.unpack(block, src, i, pair.key)
            q = xp.moveaxis(qs[rows, hs], 0, 1)
            if q.shape[1] == 0 or k.shape[1] == 0:
                continue
            gathered = [xp.ascontiguousarray(xp.moveaxis(x[rows, hs], 0, 1)) for x in (lse, delta, dout)]
            dq_o, dk_o, dv_o = self.backward_fn(xp.ascontiguousarray(q), xp.ascontiguousarray(k),
                                                xp.ascontiguousarray(v), *gathered, scale, pair.shift)
            dq[rows, hs] += xp.moveaxis(dq_o, 0, 1)
            dk_acc, dv_acc = geom.unpack(partial, src, i, pair.key)
            dk_acc += dk_o
            dv_acc += dv_o

    def gathered(self, qs: Array, dout: Array, lse: Array, delta: Array, sequence: Array, terms: Array,
                 gather: Any, scale: float, dq: Array) -> None:
        """Terms of this rank's queries against a gathered pattern's rows in sequence order
        (``distributed.gather.GatherPattern``): dQ into the shard's ``dq``, dK/dV into ``terms`` (the layout of
        ``sequence``, in the accumulator dtype)."""
        xp = array_module(qs)
        for _, region, rows, _, mk, shift in gather.problems():
            hs = gather.ring.heads_of(region.offset)
            k, v = gather.keys(sequence, region, mk)
            q, lse_q, delta_q, dout_q = (xp.ascontiguousarray(xp.moveaxis(x[rows, hs], 0, 1))
                                         for x in (qs, lse, delta, dout))
            dq_o, dk_o, dv_o = self.backward_fn(q, xp.ascontiguousarray(k), xp.ascontiguousarray(v), lse_q,
                                                delta_q, dout_q, scale, shift)
            dq[rows, hs] += xp.moveaxis(dq_o, 0, 1)
            dk_acc, dv_acc = gather.keys(terms, region, mk)
            dk_acc += dk_o
            dv_acc += dv_o


def ring_backward(qs: Array, ks: Array, vs: Array, lse: Array, delta: Array, dout: Array, geom: RingPattern,
                  causal: bool, scale: float, grads: Grads, comm: Any, transport: Any, tag: int,
                  kernels: BackwardProvider) -> RingStats:
    """One long pattern's gradient terms around its ring, added into ``grads`` (dQ, dK, dV of the shard).

    ``lse`` and ``delta`` (L, H) are the merged log-sum-exp and ``rowsum(dO * O)`` of the shard; ``kernels``
    the block provider (:class:`HostBlockBackward`). Returns the counters (``compute_s`` the block backwards,
    ``wait_s`` the exchanges not hidden behind them).
    """
    xp = array_module(ks)
    acc = kernels.accumulator_dtype(ks.dtype)
    stats = RingStats()
    g, pos = geom.group, geom.pos
    nxt, prv = geom.rank_of(pos + 1), geom.rank_of(pos - 1)
    size = max(geom.block_size(p) for p in range(g))
    blocks = [xp.empty(size, dtype=ks.dtype), xp.empty(size, dtype=ks.dtype)]
    accs = [xp.empty(size, dtype=acc) for _ in range(3)]      # outgoing, incoming, this step's partial terms

    t0 = time.perf_counter()
    cur = geom.pack(ks, vs, blocks[0])
    synchronize(xp)
    stats.pack_s += time.perf_counter() - t0

    schedule = geom.schedule(causal)
    dq = grads[0]
    done, terms_at = None, 0          # buffer of the accumulator completed last step; of this step's terms
    for t in range(g):
        src = (pos - t) % g
        size_src = geom.block_size(src)
        t_start = time.perf_counter()
        _, send, recv = schedule[t] if t < len(schedule) else (src, False, False)
        nxt_block = blocks[(t + 1) % 2][: geom.block_size(src - 1)] if recv else None
        exchanges = [transport.start(cur if send else None, nxt, nxt_block, prv, tag)]
        if send:
            stats.bytes_sent += cur.size * cur.dtype.itemsize
            stats.messages += 1
        arriving = None
        if done is not None:              # block src's accumulator comes in while ours of src + 1 goes on
            arriving = ({0, 1, 2} - {done, terms_at}).pop()
            outgoing = accs[done][: geom.block_size(src + 1)]
            exchanges.append(transport.start(outgoing, nxt, accs[arriving][:size_src], prv, tag + 1))
            stats.bytes_sent += outgoing.size * outgoing.dtype.itemsize
            stats.messages += 1
        t1 = time.perf_counter()
        pairs = geom.pairs(pos, src, causal) if t < len(schedule) else []
        terms = accs[terms_at][:size_src]
        if pairs or arriving is None:
            terms[...] = 0
        for pair in pairs:
            kernels.ring_block(qs, dout, lse, delta, cur, terms, geom, pos, src, pair, scale, dq)
        progress_until_done(xp, exchanges)
        synchronize(xp)
        t2 = time.perf_counter()
        for exchange in exchanges:
            exchange.wait()
        t3 = time.perf_counter()
        if arriving is None:              # our own block: its accumulator starts from these terms
            done, terms_at = terms_at, (terms_at + 1) % 3
        else:
            if pairs:
                accs[arriving][:size_src] += terms
            done = arriving
        stats.compute_s += t2 - t1
        stats.wait_s += (t1 - t_start) + (t3 - t2)
        if t < len(schedule):
            stats.ring_steps += 1
        if recv:
            cur = nxt_block

    # the last accumulator goes on to its owner, and ours comes home
    t4 = time.perf_counter()
    outgoing = accs[done][: geom.block_size(pos + 1)]
    home = accs[(done + 1) % 3][: geom.block_size(pos)]
    transport.start(outgoing, nxt, home, prv, tag + 1).wait()
    stats.wait_s += time.perf_counter() - t4
    stats.bytes_sent += outgoing.size * outgoing.dtype.itemsize
    stats.messages += 1
    add_home(geom, home, grads)
    return stats


def add_home(geom: RingPattern, home: Array, grads: Grads) -> None:
    """Add this rank's block of dK/dV terms (``home``, the packed block layout) into its rows of ``grads``."""
    xp = array_module(home)
    _, dk_all, dv_all = grads
    for p in geom.layout(geom.pos):
        rows, hs = geom.rows(geom.pos, p.piece, p.offset), geom.heads_of(p.offset)
        dk_home, dv_home = geom.unpack(home, geom.pos, p.index, p.piece)
        dk_all[rows, hs] += xp.moveaxis(dk_home, 0, 1)
        dv_all[rows, hs] += xp.moveaxis(dv_home, 0, 1)


def gathered_backward(qs: Array, lse: Array, delta: Array, dout: Array, rows: dict[int, tuple[Any, Array]],
                      scale: float, grads: Grads, transport: Any, kernels: BackwardProvider,
                      stats: RingStats) -> list:
    """The terms of each gathered pattern (``rows``: ``{index: (GatherPattern, sequence-order K/V)}``): dQ into
    ``grads``, dK/dV terms of the other ranks' rows posted home (tag ``301 + 2 * index``). Returns what
    :func:`finish_home` completes."""
    xp = array_module(qs)
    acc = kernels.accumulator_dtype(qs.dtype)
    t0 = time.perf_counter()
    posted = []
    for i, (gp, sequence) in rows.items():
        terms = xp.zeros(gp.sequence_elements, dtype=acc)
        kernels.gathered(qs, dout, lse, delta, sequence, terms, gp, scale, grads[0])
        by_rank = gp.to_rank_order(terms, xp.empty(gp.total, dtype=acc))
        del terms
        size = gp.sizes[gp.ring.pos]
        home = xp.empty(len(gp.targets) * size, dtype=acc)
        posted.append((gp, by_rank, home, gp.start_home(by_rank, home, transport, 301 + 2 * i)))
        stats.bytes_sent += len(gp.sources) * size * home.dtype.itemsize
        stats.messages += len(gp.sources)
    stats.compute_s += time.perf_counter() - t0
    return posted


def finish_home(posted: list, grads: Grads, stats: RingStats) -> None:
    """Wait for the terms of this rank's rows (``wait_s``) and add them, its own first then the other ranks' in
    rank order, into ``grads``."""
    for gp, by_rank, home, exchange in posted:
        t0 = time.perf_counter()
        exchange.wait()
        stats.wait_s += time.perf_counter() - t0
        own = gp.block(by_rank, gp.ring.pos)
        size = own.size
        for j in range(len(gp.targets)):
            own += home[j * size:(j + 1) * size]
        add_home(gp.ring, own, grads)


def ring_dilated_backward(qs: Array, ks: Array, vs: Array, out: Array, lse: Array, dout: Array, *,
                          patterns: Sequence[Pattern], comm: Any, causal: bool = False,
                          scale: float | None = None, transport: Any = None,
                          backward_fn: BackwardFn = attend_backward, kernels: BackwardProvider | None = None,
                          stats: RingStats | None = None, sync_rings: bool = False,
                          placement: str = "contiguous", schedule: Any = "auto",
                          gathered: dict | None = None) -> Grads:
    """Gradients (dQ, dK, dV) of this rank's serialized shard of distributed dilated attention.

    Every rank of ``comm`` calls this with its shards (placed by ``placement``, as in the forward) of the
    inputs, of the output ``out`` and log-sum-exp ``lse`` of
    :func:`hilbert_hpc.distributed.ring.ring_dilated_forward` (the merged ones), and of the output gradient
    ``dout`` (L, H, Dv). The results, in the provider's accumulator dtype, equal the shard's rows of the
    single-rank :func:`hilbert_hpc.core.backward.local_dilated_backward` of the whole sequence.
    ``transport``, ``stats``, ``sync_rings`` and ``schedule`` as in the forward; ``kernels`` is the block provider
    (a backend's ``ring_backward_kernels``), by default :class:`HostBlockBackward` of ``backward_fn``.
    ``gathered``: the forward's gathered rows (its ``gathered`` dict); a gathered pattern found there is not
    gathered again, its terms are computed first and go home while the local patterns' gradients are computed.
    """
    from hilbert_hpc.distributed.transports import HostTransport

    xp = array_module(qs)
    shard, heads, dk = qs.shape
    dv = vs.shape[-1]
    scale = 1.0 / math.sqrt(dk) if scale is None else scale
    transport = transport or HostTransport(comm)
    stats = stats if stats is not None else RingStats()
    kernels = kernels if kernels is not None else HostBlockBackward(backward_fn)
    shards = Shards(shard * comm.Get_size(), comm.Get_size(), placement)
    kinds = schedule_kinds(schedule, patterns, shards, heads, dk, dv, ks.dtype.itemsize, True)
    local = [p for p in patterns if p.segment <= shards.chunk]
    have = dict(gathered or {})
    missing = [(i, gp) for i, gp in gather_patterns(patterns, shards, comm.Get_rank(), heads, dk, dv, causal, kinds)
               if i not in have]
    posted = post_gathers(ks, vs, missing, transport, 500, stats)
    t0 = time.perf_counter()
    delta = kernels.row_delta(dout, out)
    grads = kernels.local_backward(qs, ks, vs, out, lse, dout, delta, local if posted else [], causal, scale)
    progress_until_done(xp, [p[3] for p in posted])
    synchronize(xp)
    stats.local_s += time.perf_counter() - t0
    meet(comm, stats, sync_rings and bool(posted))
    have.update(finish_gathers(posted, stats))
    homes = gathered_backward(qs, lse, delta, dout, have, scale, grads, transport, kernels, stats)
    del have
    if not posted:                        # the local patterns' gradients while the terms go home
        t0 = time.perf_counter()
        if local:
            kernels.local_backward(qs, ks, vs, out, lse, dout, delta, local, causal, scale, into=grads)
        progress_until_done(xp, [h[3] for h in homes])
        synchronize(xp)
        stats.local_s += time.perf_counter() - t0
    meet(comm, stats, sync_rings and bool(homes))
    finish_home(homes, grads, stats)
    for i, geom in long_rings(patterns, shards, comm, heads, dk, dv, stats if sync_rings else None, kinds):
        stats.add(ring_backward(qs, ks, vs, lse, delta, dout, geom, causal, scale, grads, comm, transport,
                                tag=300 + 2 * i, kernels=kernels))
    return grads
