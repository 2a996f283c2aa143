"""The memory of one rank for a case, term by term: the one model ``plan``, ``run`` and the projection count.

:class:`MemoryModel` is built once from a case's setup (``study.setup.CaseSetup``:
its layout, precision, backend, kernel and long-pattern schedules). Each term is
one method; ``terms`` names them in the order ``plan --breakdown`` prints them
and ``total`` is their sum, what ``plan.estimate`` reports as the memory per
rank (``run`` refuses a case on it, ``plan`` prints it, the projection scales
it). What depends on the backend (its output's element size, its working
memory, its gradients, its backward's working memory, where a plan counts it)
is the backend's memory description (``Backend.memory``, ``backends.memory``).
"""

from __future__ import annotations

from functools import cached_property
from typing import Iterator, Sequence

from hilbert_hpc.backends.memory import RankShape
from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.core.reference_backward import reference_bytes
from hilbert_hpc.distributed.ring import RingPattern
from hilbert_hpc.distributed.schedule import LongSchedule
from hilbert_hpc.distributed.sharding import Shards
from hilbert_hpc.study.gradients import backward_pass
from hilbert_hpc.study.jobfile import DEFAULT_ACCURACY_ROWS, Case
from hilbert_hpc.study.setup import CaseSetup


def long_patterns(case: Case, shards: Shards, schedules: Sequence[LongSchedule]) -> Iterator[tuple[Pattern, str]]:
    """Each pattern of ``case`` that spans ranks on ``shards`` with how it moves its K/V rows: its schedule's kind
    (``LongSchedule.kind``, 'ring' or 'gather'; a long pattern without a schedule: 'ring')."""
    kinds = {s.index: s.kind for s in schedules}
    for index, p in enumerate(case.patterns):
        if p.segment > shards.chunk:
            yield p, kinds.get(index, "ring")


def largest_ring_block(case: Case, shards: Shards, itemsize: int, schedules: Sequence[LongSchedule] = ()) -> int:
    """Bytes of the largest packed K/V block of the ring patterns of ``case`` over the ranks (``schedules``: as in
    :func:`long_patterns`), in elements of ``itemsize`` bytes; 0 without a ring pattern."""
    largest = 0
    for p, kind in long_patterns(case, shards, schedules):
        if kind == "ring":
            for rank in range(shards.ranks):
                geom = RingPattern(p, shards, rank, case.heads, case.head_dim, case.head_dim)
                largest = max(largest, geom.block_size(geom.pos) * itemsize)
    return largest


class MemoryModel:
    """Every term of one rank's memory for the case of ``setup`` (bytes).

    ``accuracy_rows``: the rows of the study's float64 gradient check of a
    forward+backward case (:meth:`gradient_check`; 0: a training step, without it).
    The forward holds Q, K, V and the output (:meth:`qkvo`), the log-sum-exp, the
    backend's working memory, the ring buffers and the gathered rows; a
    forward+backward case also dO, the gradients, rowsum(dO * O), the backward's
    working memory, the ring backward's accumulators and the gradient check.
    """

    def __init__(self, setup: CaseSetup, accuracy_rows: int = DEFAULT_ACCURACY_ROWS) -> None:
        case = setup.case
        self.setup = setup
        self.accuracy_rows = accuracy_rows
        #: the backend's memory description (``Backend.memory``)
        self.backend_memory = setup.backend.memory
        self.shards = setup.layout.shards
        self.backward = backward_pass(case)
        self.shape = RankShape(shard=self.shards.shard, heads=case.heads, head_dim=case.head_dim,
                               itemsize=setup.precision.itemsize, patterns=tuple(case.patterns), batch=case.batch,
                               ranks=self.shards.ranks, kernel=setup.kernel)

    @cached_property
    def _largest_ring_block(self) -> int:
        """Bytes of the largest packed K/V block of the ring patterns (0 on one rank)."""
        if self.shards.ranks == 1:
            return 0
        return largest_ring_block(self.setup.case, self.shards, self.shape.itemsize, self.setup.schedules)

    # the forward

    def qkvo(self) -> int:
        """Q, K, V and the output of every batch element, as the backend holds them: the floor."""
        return self.backend_memory.qkvo_bytes(self.shape)

    def log_sum_exp(self) -> int:
        """The log-sum-exp of the shard's rows and heads, in the accumulator dtype."""
        return self.shape.shard * self.shape.heads * self.shape.acc_itemsize

    def workspace(self) -> int:
        """The backend's working memory (``BackendMemory.workspace_bytes``: score tiles, the peers' gathered copies,
        tma16's float32 running output)."""
        return self.backend_memory.workspace_bytes(self.shape)

    def ring_buffers(self) -> int:
        """The ring's two buffers (outgoing, incoming) of the largest packed K/V block of the ring patterns."""
        return 2 * self._largest_ring_block

    def gathered(self) -> int:
        """What the gathered long patterns hold together (``LongSchedule.gather_bytes``: their rows, and in the
        backward their gradient terms): their exchanges are all posted before the local patterns, and the
        backward reuses the forward's rows."""
        return sum(s.gather_bytes(self.shape.itemsize, self.backward) for s in self.setup.schedules
                   if s.kind == "gather")

    # the backward (0 for pass = "forward")

    def output_gradient(self) -> int:
        """dO of every batch element, in the case's dtype."""
        return self.shape.batch * self.shape.shard * self.shape.row * self.shape.itemsize if self.backward else 0

    def gradients(self) -> int:
        """dQ, dK, dV as the backend holds them (``BackendMemory.gradient_bytes``)."""
        return self.backend_memory.gradient_bytes(self.shape) if self.backward else 0

    def row_delta(self) -> int:
        """rowsum(dO * O) of one batch element, in the accumulator dtype."""
        return self.shape.shard * self.shape.heads * self.shape.acc_itemsize if self.backward else 0

    def backward_workspace(self) -> int:
        """The backend's backward working memory (``BackendMemory.backward_workspace_bytes``)."""
        return self.backend_memory.backward_workspace_bytes(self.shape) if self.backward else 0

    def ring_accumulators(self) -> int:
        """The ring backward's three accumulator blocks (outgoing, incoming, this step's terms): the size of the
        largest packed K/V block of the ring patterns, in the accumulator dtype (the gathered patterns' terms
        are counted with their rows, :meth:`gathered`)."""
        if not self.backward:
            return 0
        return 3 * self._largest_ring_block // self.shape.itemsize * self.shape.acc_itemsize

    def gradient_check(self) -> int:
        """The first call's float64 gradient check of ``accuracy_rows`` sampled rows
        (``core.reference_backward.reference_bytes``)."""
        if not (self.backward and self.accuracy_rows):
            return 0
        case = self.setup.case
        return reference_bytes(case.tokens, case.heads, case.head_dim, case.patterns, self.accuracy_rows)

    # together

    def terms(self) -> dict[str, int]:
        """Every term by the name ``plan --breakdown`` prints, forward then backward."""
        return {"Q/K/V/O": self.qkvo(), "lse": self.log_sum_exp(), "work": self.workspace(),
                "ring": self.ring_buffers(), "gathered": self.gathered(), "dO": self.output_gradient(),
                "dQ/dK/dV": self.gradients(), "delta": self.row_delta(), "bwd work": self.backward_workspace(),
                "ring acc": self.ring_accumulators(), "check": self.gradient_check()}

    def total(self) -> int:
        """The memory per rank: the sum of :meth:`terms`."""
        return sum(self.terms().values())

    def on_gpu(self, gpu_nodes: bool | None = None) -> bool:
        """Whether the memory is counted on a GPU (``BackendMemory.counted_on_gpu``); ``gpu_nodes``: the plan is for
        GPU nodes (True), or for this machine (None)."""
        return self.backend_memory.counted_on_gpu(self.setup.backend, gpu_nodes)
