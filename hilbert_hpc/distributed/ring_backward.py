"""Exact backward of distributed dilated attention: dK/dV accumulators ride the K/V ring and come home.

docs/semantics.md, section 10 (its ring paragraph). Local patterns are
differentiated in place (:func:`hilbert_hpc.core.backward.local_dilated_backward`
on the shard). For a pattern spanning a ring of ``g`` ranks the packed K/V
blocks rotate exactly as in the forward (:func:`hilbert_hpc.distributed.ring.ring_schedule`,
forward direction: position ``p`` sends to ``p + 1``). Next to each K/V block
travels a float accumulator block of the same layout (``dK`` rows then ``dV``
rows of every head offset, in the accumulator dtype) that starts as zeros at
the block's owner; every rank the block visits adds the terms of its own
selected queries (:func:`hilbert_hpc.core.backward.attend_backward` against the
merged ``L`` and ``delta = rowsum(dO * O)``) and forwards it to ``p + 1``. The
accumulators always make the full ``g`` hops, so after the last step each one
arrives at its owner (one more send, to the same neighbour) and is added into
the owner's dK/dV rows. In a causal ring the K/V blocks stop travelling as in
the forward; the accumulators keep going to get home, and positions after the
last one that needs a block only relay its accumulator. dQ never leaves the rank.

One exchange is in flight at a time (the staged transport reuses its pinned
buffers): each step's K/V exchange overlaps that step's compute, then the
accumulator that was just completed moves on. The compute works on any
NumPy-like array module; ``backward_fn`` is the replaceable block backward.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

from hilbert_hpc.core.backward import Grads, attend_backward, local_dilated_backward, row_delta
from hilbert_hpc.core.blockwise import accumulator_dtype, array_module
from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.distributed.ring import RingPattern, RingStats, ring_schedule

Array = Any

#: ``(q, k, v, lse, delta, dout, scale, causal_shift) -> (dq, dk, dv)`` of one block, as
#: :func:`hilbert_hpc.core.backward.attend_backward`.
BackwardFn = Callable[..., Grads]


def _offset_rows(x: Array, geom: RingPattern, pos: int, o: int) -> Array:
    """The selected rows of head offset ``o`` of a shard array, heads first: (nh, m, ...)."""
    xp = array_module(x)
    return xp.ascontiguousarray(xp.moveaxis(x[geom.rows(pos, o), geom.heads_of(o)], 0, 1))


def ring_backward(qs: Array, ks: Array, vs: Array, lse: Array, delta: Array, dout: Array, geom: RingPattern,
                  causal: bool, scale: float, grads: Grads, comm: Any, transport: Any, tag: int,
                  backward_fn: BackwardFn = attend_backward) -> RingStats:
    """One long pattern's gradient terms around its ring, added into ``grads`` (dQ, dK, dV of the shard).

    ``lse`` and ``delta`` (L, H) are the merged log-sum-exp and ``rowsum(dO * O)`` of the shard.
    Returns the counters (``compute_s`` the block backwards, ``wait_s`` the exchanges).
    """
    xp = array_module(ks)
    acc = accumulator_dtype(ks.dtype)
    stats = RingStats()
    rank, g = comm.Get_rank(), geom.group
    pos = rank % g
    base = rank - pos
    nxt, prv = base + (pos + 1) % g, base + (pos - 1) % g
    size = max(geom.block_size(p) for p in range(g))
    blocks = [xp.empty(size, dtype=ks.dtype), xp.empty(size, dtype=ks.dtype)]
    accs = [xp.empty(size, dtype=acc), xp.empty(size, dtype=acc)]

    t0 = time.perf_counter()
    cur = geom.pack(ks, vs, pos, blocks[0])
    cur_acc = accs[0][: geom.block_size(pos)]
    cur_acc[...] = 0
    inputs = [tuple(_offset_rows(x, geom, pos, o) for x in (qs, lse, delta, dout)) for o in geom.offsets]
    dqs = [xp.zeros(q.shape, dtype=acc) for q, *_ in inputs]
    stats.pack_s += time.perf_counter() - t0

    schedule = ring_schedule(pos, g, causal)
    for t in range(g):
        src = (pos - t) % g
        incoming = (src - 1) % g
        t_start = time.perf_counter()
        if t < len(schedule):
            _, send, recv = schedule[t]
            nxt_block = blocks[(t + 1) % 2][: geom.block_size(incoming)] if recv else None
            exchange = transport.start(cur if send else None, nxt, nxt_block, prv, tag)
            if send:
                stats.bytes_sent += cur.size * cur.dtype.itemsize
                stats.messages += 1
            t1 = time.perf_counter()
            shift = 0 if (causal and src == pos) else None
            for i in range(len(geom.offsets)):
                q, lse_o, delta_o, dout_o = inputs[i]
                k, v = geom.unpack(cur, src, i)
                if q.shape[1] == 0 or k.shape[1] == 0:
                    continue
                dk_acc, dv_acc = geom.unpack(cur_acc, src, i)
                dq, dk, dv = backward_fn(q, xp.ascontiguousarray(k), xp.ascontiguousarray(v), lse_o, delta_o,
                                         dout_o, scale, shift)
                dqs[i] += dq
                dk_acc += dk
                dv_acc += dv
            if xp.__name__ == "cupy":
                xp.cuda.get_current_stream().synchronize()
            t2 = time.perf_counter()
            exchange.wait()
            stats.compute_s += t2 - t1
            stats.wait_s += time.perf_counter() - t2 + (t1 - t_start)
            if recv:
                cur = nxt_block
            stats.ring_steps += 1
        # the accumulator moves on (after the last step: to its owner) and the next one (or this rank's own,
        # home) arrives
        t3 = time.perf_counter()
        nxt_acc = accs[(t + 1) % 2][: geom.block_size(incoming)]
        transport.start(cur_acc, nxt, nxt_acc, prv, tag + 1).wait()
        stats.wait_s += time.perf_counter() - t3
        stats.bytes_sent += cur_acc.size * cur_acc.dtype.itemsize
        stats.messages += 1
        cur_acc = nxt_acc

    dq_all, dk_all, dv_all = grads
    for i, o in enumerate(geom.offsets):
        rows, hs = geom.rows(pos, o), geom.heads_of(o)
        dq_all[rows, hs] += xp.moveaxis(dqs[i], 0, 1)
        dk_home, dv_home = geom.unpack(cur_acc, pos, i)
        dk_all[rows, hs] += xp.moveaxis(dk_home, 0, 1)
        dv_all[rows, hs] += xp.moveaxis(dv_home, 0, 1)
    return stats


def ring_dilated_backward(qs: Array, ks: Array, vs: Array, out: Array, lse: Array, dout: Array, *,
                          patterns: Sequence[Pattern], comm: Any, causal: bool = False,
                          scale: float | None = None, transport: Any = None,
                          backward_fn: BackwardFn = attend_backward, stats: RingStats | None = None,
                          sync_rings: bool = False) -> Grads:
    """Gradients (dQ, dK, dV) of this rank's serialized shard of distributed dilated attention.

    Every rank of ``comm`` calls this with its shards of the inputs, of the output
    ``out`` and log-sum-exp ``lse`` of :func:`hilbert_hpc.distributed.ring.ring_dilated_forward`
    (the merged ones), and of the output gradient ``dout`` (L, H, Dv). The results,
    in the accumulator dtype, equal the shard's rows of the single-rank
    :func:`hilbert_hpc.core.backward.local_dilated_backward` of the whole sequence.
    ``transport``, ``stats`` and ``sync_rings`` as in the forward; ``backward_fn``
    computes one block's terms.
    """
    from hilbert_hpc.distributed.transports import HostTransport

    xp = array_module(qs)
    shard, heads, dk = qs.shape
    dv = vs.shape[-1]
    scale = 1.0 / math.sqrt(dk) if scale is None else scale
    transport = transport or HostTransport(comm)
    stats = stats if stats is not None else RingStats()
    acc = accumulator_dtype(qs.dtype)
    t0 = time.perf_counter()
    delta = row_delta(dout, out, acc)
    grads = local_dilated_backward(qs, ks, vs, out, lse, dout, [p for p in patterns if p.segment <= shard], causal,
                                   scale, delta)
    if xp.__name__ == "cupy":
        xp.cuda.get_current_stream().synchronize()
    stats.local_s += time.perf_counter() - t0
    for i, p in enumerate(patterns):
        if p.segment > shard:
            if sync_rings:
                t1 = time.perf_counter()
                comm.Barrier()
                stats.imbalance_s += time.perf_counter() - t1
            geom = RingPattern(p, shard, heads, dk, dv)
            stats.add(ring_backward(qs, ks, vs, lse, delta, dout, geom, causal, scale, grads, comm, transport,
                                    tag=300 + 2 * i, backward_fn=backward_fn))
    return grads
