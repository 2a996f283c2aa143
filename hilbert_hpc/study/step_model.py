"""The projection's step model: the time of one forward and one backward on each rank, term by term.

Per rank of a case on P ranks, with ``R`` / ``R_bwd`` the useful TFLOP/s of one
GPU, ``alpha`` and ``B`` the latency and bandwidth of the case's transport
(:class:`Link`), ``c_hop`` the fixed cost of a ring step and ``c_launch`` that of a
gathered pattern (:class:`FixedCost`), and ``F`` useful FLOPs (the backward's
``BACKWARD_FLOPS`` times the forward's):

- local patterns: ``F_local / R`` (:func:`local_compute_s`);
- a gathered pattern (``distributed.schedule``): ``F_i / R`` (:func:`long_compute_s`)
  plus ``c_launch``; its exchange, ``(g - 1) (alpha + block / B)``
  (:func:`gather_exchange_s`), is posted before the local patterns run, so the
  gathered patterns' exchanges together are exposed only beyond the local compute,
  ``max(0, exchange - local)`` (:func:`exposed_exchange_s`). Backward: the same
  compute and launch; the terms go home in ``(g - 1) (alpha + terms / B)``
  (:func:`gather_home_exchange_s`, float32 terms at least), exposed beyond the local backward;
- a ring pattern, per step of its schedule: ``max(F_i / steps / R, alpha + block / B)
  + c_hop`` (the exchange only on steps that send or receive; :func:`ring_forward_terms`).
  Backward (:func:`ring_backward_terms`): ``g`` steps, each moving the K/V block
  (where the forward's step does) and, after the first, an accumulator block
  next to it; ``c_hop`` on the steps that compute; then the accumulator home.

Each rank's step is split into four terms (:class:`Terms`): local compute, long
compute, exposed exchange (``alpha`` included), and the fixed per-step and per-launch
costs; the step of a case is its slowest rank's (:func:`slowest_rank`). Every
batch element runs the whole step.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Sequence

from hilbert_hpc.core.patterns import BACKWARD_FLOPS
from hilbert_hpc.core.work import rank_useful_flops
from hilbert_hpc.distributed.ring import RingPattern
from hilbert_hpc.distributed.schedule import LongSchedule
from hilbert_hpc.study.jobfile import Case
from hilbert_hpc.study.setup import CaseSetup


@dataclass(frozen=True)
class Link:
    """Latency ``alpha`` (s) and bandwidth ``B`` (GB/s per rank) of one transport, and where each comes from."""

    transport: str
    alpha_s: float
    gb_per_s: float
    alpha_source: str
    b_source: str

    def message_s(self, nbytes: float) -> float:
        """``alpha + bytes / B``: one message of ``nbytes`` bytes."""
        return self.alpha_s + nbytes / (self.gb_per_s * 1e9)


@dataclass(frozen=True)
class FixedCost:
    """A fixed cost of a backend (seconds), forward and backward, and where it comes from: per ring step
    (launches, merges, host work) or per launch of a gathered pattern."""

    forward_s: float
    backward_s: float
    source: str


@dataclass(frozen=True)
class Terms:
    """One rank's step time (seconds) split into the model's terms."""

    local_s: float = 0.0
    long_s: float = 0.0
    exposed_s: float = 0.0
    fixed_s: float = 0.0

    @property
    def total_s(self) -> float:
        """The step: the sum of the terms."""
        return self.local_s + self.long_s + self.exposed_s + self.fixed_s

    def __add__(self, other: "Terms") -> "Terms":
        return Terms(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def times(self, k: float) -> "Terms":
        """Every term times ``k`` (the batch elements)."""
        return Terms(*(getattr(self, f.name) * k for f in fields(self)))

    @property
    def dominant(self) -> str:
        """The largest term's short name (``TERM_NAMES``)."""
        return max(TERM_NAMES, key=lambda name: getattr(self, name + "_s"))


#: the terms' short names (the projection's ``dominant`` column) and what they are
TERM_NAMES = {"local": "local compute", "long": "long compute", "exposed": "exposed exchange",
              "fixed": "per-step and per-launch fixed costs"}


def local_compute_s(flops: float, tflops: float) -> float:
    """Local patterns: ``F_local / R``."""
    return flops / (tflops * 1e12)


def long_compute_s(flops: float, tflops: float) -> float:
    """A long pattern's own compute: ``F_i / R``."""
    return flops / (tflops * 1e12)


def gather_exchange_s(schedule: LongSchedule, itemsize: int, link: Link) -> float:
    """A gathered pattern's exchange: ``(g - 1) (alpha + block / B)``, the largest rank's block."""
    return (schedule.group - 1) * link.message_s(schedule.block_elements * itemsize)


def gather_home_exchange_s(schedule: LongSchedule, itemsize: int, link: Link) -> float:
    """A gathered pattern's backward exchange home: ``(g - 1) (alpha + terms / B)``, the terms of a block in
    the accumulator dtype (float32 at least)."""
    return (schedule.group - 1) * link.message_s(schedule.block_elements * max(itemsize, 4))


def exposed_exchange_s(exchange_s: float, hidden_behind_s: float) -> float:
    """What of an exchange the compute it hides behind does not cover: ``max(0, exchange - compute)``."""
    return max(0.0, exchange_s - hidden_behind_s)


def ring_forward_terms(flops: float, steps: Sequence[bool], block_bytes: int, tflops: float, link: Link,
                       hop_s: float) -> Terms:
    """A ring pattern on one rank: per step ``max(F / steps / R, alpha + block / B) + c_hop``, the exchange on
    the steps that send or receive (``steps``: one flag a step)."""
    if not steps:
        return Terms()
    compute = long_compute_s(flops, tflops) / len(steps)
    exchange = link.message_s(block_bytes)
    exposed = sum(exposed_exchange_s(exchange, compute) for moves in steps if moves)
    return Terms(long_s=compute * len(steps), exposed_s=exposed, fixed_s=hop_s * len(steps))


def ring_backward_terms(flops: float, steps: Sequence[bool], group: int, block_bytes: int, acc_bytes: int,
                        tflops: float, link: Link, hop_s: float) -> Terms:
    """A ring pattern's backward on one rank: ``group`` steps; those of the forward's schedule compute
    ``BACKWARD_FLOPS F / steps / R_bwd`` and move the K/V block where the forward's do; every step after the
    first moves an accumulator block; ``c_hop`` per computing step; then the accumulator home, exposed."""
    if not steps:
        return Terms()
    compute = long_compute_s(BACKWARD_FLOPS * flops, tflops) / len(steps)
    exposed = 0.0
    for t in range(max(group, len(steps))):
        exchange = link.message_s(block_bytes) if t < len(steps) and steps[t] else 0.0
        exchange += link.message_s(acc_bytes) if t else 0.0
        exposed += exposed_exchange_s(exchange, compute if t < len(steps) else 0.0)
    return Terms(long_s=compute * len(steps), exposed_s=exposed + link.message_s(acc_bytes),
                 fixed_s=hop_s * len(steps))


@dataclass(frozen=True)
class LongPattern:
    """What the model needs of one long pattern: its schedule, each rank's useful forward FLOPs of it (one
    batch element), and for a ring each rank's steps (True where the step sends or receives)."""

    schedule: LongSchedule
    flops: tuple[int, ...]
    steps: tuple[tuple[bool, ...], ...]


@dataclass(frozen=True)
class StepGeometry:
    """The work and the exchanges of every rank of one case on its ranks."""

    ranks: int
    batch: int
    itemsize: int
    local_flops: tuple[int, ...]
    long: tuple[LongPattern, ...]

    @classmethod
    def of(cls, case: Case, setup: CaseSetup) -> "StepGeometry":
        """The geometry of ``case`` as ``setup`` lays it out (its shards and its long patterns' schedules)."""
        shards = setup.layout.shards
        ranks = setup.ranks

        def flops(patterns: list) -> tuple[int, ...]:
            return tuple(rank_useful_flops(case.tokens, ranks, case.heads, case.head_dim, patterns, case.causal,
                                           1, shards.placement))

        local = [p for p in case.patterns if p.segment <= shards.chunk]
        long = []
        for s in setup.schedules:
            p = case.patterns[s.index]
            steps = () if s.kind == "gather" else tuple(
                tuple(send or recv for _, send, recv in RingPattern(p, shards, rank, case.heads, case.head_dim,
                                                                    case.head_dim).schedule(case.causal))
                for rank in range(ranks))
            long.append(LongPattern(s, flops([p]), steps))
        return cls(ranks, case.batch, setup.precision.itemsize, flops(local), tuple(long))

    def forward_terms(self, rank: int, tflops: float, link: Link, hop: FixedCost, launch: FixedCost) -> Terms:
        """Rank ``rank``'s forward (every batch element)."""
        local = local_compute_s(self.local_flops[rank], tflops)
        terms, exchange = Terms(local_s=local), 0.0
        for lp in self.long:
            s = lp.schedule
            if s.kind == "gather":
                terms += Terms(long_s=long_compute_s(lp.flops[rank], tflops), fixed_s=launch.forward_s)
                exchange += gather_exchange_s(s, self.itemsize, link)
            else:
                terms += ring_forward_terms(lp.flops[rank], lp.steps[rank], s.block_elements * self.itemsize,
                                            tflops, link, hop.forward_s)
        return (terms + Terms(exposed_s=exposed_exchange_s(exchange, local))).times(self.batch)

    def backward_terms(self, rank: int, tflops: float, link: Link, hop: FixedCost, launch: FixedCost) -> Terms:
        """Rank ``rank``'s backward (every batch element)."""
        local = local_compute_s(BACKWARD_FLOPS * self.local_flops[rank], tflops)
        terms, home = Terms(local_s=local), 0.0
        acc = max(self.itemsize, 4)
        for lp in self.long:
            s = lp.schedule
            if s.kind == "gather":
                terms += Terms(long_s=long_compute_s(BACKWARD_FLOPS * lp.flops[rank], tflops),
                               fixed_s=launch.backward_s)
                home += gather_home_exchange_s(s, self.itemsize, link)
            else:
                terms += ring_backward_terms(lp.flops[rank], lp.steps[rank], s.group,
                                             s.block_elements * self.itemsize, s.block_elements * acc, tflops, link,
                                             hop.backward_s)
        return (terms + Terms(exposed_s=exposed_exchange_s(home, local))).times(self.batch)


def slowest_rank(geometry: StepGeometry, forward_tflops: float, backward_tflops: float | None, link: Link,
                 hop: FixedCost, launch: FixedCost) -> tuple[int, Terms, Terms]:
    """(rank, forward terms, backward terms) of the rank whose step takes longest; ``backward_tflops`` None:
    no backward (its terms are 0)."""
    best = None
    for rank in range(geometry.ranks):
        fwd = geometry.forward_terms(rank, forward_tflops, link, hop, launch)
        bwd = Terms() if backward_tflops is None else geometry.backward_terms(rank, backward_tflops, link, hop,
                                                                              launch)
        if best is None or fwd.total_s + bwd.total_s > best[1].total_s + best[2].total_s:
            best = (rank, fwd, bwd)
    return best
