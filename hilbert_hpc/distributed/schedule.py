"""How each long pattern's K/V rows reach the ranks that need them: gathered once, or rotated around a ring.

A pattern whose segment spans ``g`` ranks (``Shards.ring_ranks``) needs, on every
rank of its group, the selected K/V rows of the whole group. Two schedules move them:

``gather``  every rank packs its selected rows once and sends them to every other
            rank of the group at once (posted ``Isend``/``Irecv``), before the
            local patterns run, so the exchange hides behind them; the pattern is
            then one launch over all the group's rows. The backward sends each
            rank's dK/dV terms home in one exchange. Memory: the group's packed
            rows, twice (as received, and in sequence order), plus float32
            accumulators of them in the backward.
``ring``    the packed blocks rotate around the group, ``g - 1`` hops, each hop's
            block attended while the next one travels (ring attention proper): for
            patterns whose selected rows are too many to hold at once (the
            ``(N, 1)`` pattern gathers the whole sequence).

``auto`` (the default) gathers where the gathered rows fit :data:`GATHER_BUDGET`
times the shard's Q, K and V, and rotates otherwise. LongNet's patterns keep
``w / r`` rows a segment, so the long ones nearly always gather. The choice is
made once per case (``study.setup.CaseSetup.schedules``), recorded with the
results and shown by ``plan``; the ring functions take it as they are given it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.distributed.sharding import Shards, count, selected_rows
from hilbert_hpc.errors import ConfigError

#: the schedules a case may ask for (job key ``long_schedule``)
SCHEDULES = ("auto", "gather", "ring")

#: ``auto`` gathers a pattern when its gathered rows (all buffers, forward and backward) take at most this times
#: the bytes of the shard's Q, K and V
GATHER_BUDGET = 1.0


@dataclass(frozen=True)
class LongSchedule:
    """The schedule of one long pattern on a case's ranks."""

    #: index of the pattern in the case's pattern list
    index: int
    segment: int
    dilation: int
    #: ranks of its group (the ring)
    group: int
    #: ``gather`` or ``ring``
    kind: str
    #: elements of the largest rank's packed block (selected K and V rows of every head offset)
    block_elements: int
    #: elements of the group's packed blocks together (what a gathering rank holds)
    gathered_elements: int
    #: why this kind (one sentence)
    reason: str

    def gather_bytes(self, itemsize: int, backward: bool) -> int:
        """Device bytes the gather schedule holds for this pattern: the received blocks and their sequence-order
        copy in ``itemsize`` bytes, and in the backward their float32 (at least) gradient terms twice and the
        terms that come home (``group`` blocks)."""
        held = 2 * self.gathered_elements * itemsize
        if backward:
            acc = max(itemsize, 4)
            held += 2 * self.gathered_elements * acc + self.group * self.block_elements * acc
        return held

    def describe(self) -> str:
        """``(w, r) over g ranks: kind`` for ``plan`` and notes."""
        return f"({self.segment}, {self.dilation}) over {self.group} ranks: {self.kind}"


def block_elements(pattern: Pattern, shards: Shards, rank: int, heads: int, dk: int, dv: int) -> int:
    """Elements of ``rank``'s packed block of ``pattern``: its selected K and V rows of every head offset."""
    total = 0
    for o in range(min(pattern.dilation, heads)):
        nh = len(range(o, heads, pattern.dilation))
        for pc in shards.pieces(rank):
            sel = selected_rows(pc.start, pc.rows, pattern, o)
            total += count(slice(sel.start, pc.rows, sel.step)) * nh * (dk + dv)
    return total


def choose_schedules(patterns: Sequence[Pattern], shards: Shards, heads: int, dk: int, dv: int, itemsize: int,
                     requested: str = "auto", backward: bool = False,
                     budget: float = GATHER_BUDGET) -> tuple[LongSchedule, ...]:
    """The schedule of every pattern of ``patterns`` that spans ranks on ``shards`` (local ones have none).

    ``requested``: ``auto``, or ``gather`` / ``ring`` for every long pattern;
    ``itemsize``: bytes of an element the ring moves; ``backward``: the case has
    a backward (the gather schedule then also holds gradient terms). The choice
    depends only on its arguments, so every rank makes the same one.
    """
    if requested not in SCHEDULES:
        raise ConfigError(f"unknown long_schedule {requested!r}; choose one of {', '.join(SCHEDULES)}",
                          "long_schedule")
    shard_bytes = shards.shard * heads * (2 * dk + dv) * itemsize
    out = []
    for index, p in enumerate(patterns):
        if p.segment <= shards.chunk:
            continue
        group = shards.ring_ranks(p)
        sizes = [block_elements(p, shards, rank, heads, dk, dv) for rank in range(group)]
        sched = LongSchedule(index, p.segment, p.dilation, group, "ring", max(sizes), int(np.sum(sizes)), "")
        held = sched.gather_bytes(itemsize, backward)
        if requested != "auto":
            kind, reason = requested, f"long_schedule = {requested!r}"
        elif held <= budget * shard_bytes:
            kind = "gather"
            reason = (f"its group's selected rows take {held / shard_bytes:.2f}x the shard's Q, K, V "
                      f"(<= {budget:g}x): gathered at once")
        else:
            kind = "ring"
            reason = (f"its group's selected rows would take {held / shard_bytes:.2f}x the shard's Q, K, V "
                      f"(> {budget:g}x): rotated around the ring")
        out.append(LongSchedule(index, p.segment, p.dilation, group, kind, max(sizes), int(np.sum(sizes)), reason))
    return tuple(out)


def schedule_kinds(schedules: Sequence[LongSchedule] | str, patterns: Sequence[Pattern], shards: Shards,
                   heads: int, dk: int, dv: int, itemsize: int, backward: bool) -> dict[int, str]:
    """``{pattern index: kind}`` of the long patterns: from a decided ``schedules`` sequence as given, or from a
    requested name (``SCHEDULES``) decided here by :func:`choose_schedules`."""
    if isinstance(schedules, str):
        schedules = choose_schedules(patterns, shards, heads, dk, dv, itemsize, schedules, backward)
    return {s.index: s.kind for s in schedules}
