"""What one case runs with, decided once before any work: precision, backend, kernel, transport.

:func:`check_case` makes every check that can refuse a case before any work
(identically on every rank) and every choice that follows from the case and
this machine; the runner, the measurement (``measure.CaseRun``), the ring and the
results then read the :class:`CaseSetup` instead of deciding again. ``plan``
builds the same object through :func:`plan_setup`, which differs only where the
plan's machine cannot decide: no transport (no communicator), and no kernel
choice where the GPU is missing (a login node).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hilbert_hpc.backends import Backend, find_backend, require_usable
from hilbert_hpc.core.ordering import resolve_ordering
from hilbert_hpc.core.precision import Precision, precision
from hilbert_hpc.core.work import imbalance, rank_useful_flops
from hilbert_hpc.distributed.sharding import Layout, check_distribution, zigzag_possible
from hilbert_hpc.distributed.schedule import LongSchedule, choose_schedules
from hilbert_hpc.distributed.transports import TransportChoice, choose_transport
from hilbert_hpc.errors import ConfigError
from hilbert_hpc.kernels.selection import KernelChoice
from hilbert_hpc.study.jobfile import Case, Job

#: what a case on one rank records as its transport and the reason
SINGLE_RANK = TransportChoice("none", "single rank: no communication")


#: ``auto`` keeps contiguous shards while their largest rank's useful FLOPs are at most this times the mean
BALANCED = 1.05


def case_placement(case: Case, ranks: int) -> str:
    """The placement of ``case`` on ``ranks`` ranks (``distributed.sharding.PLACEMENTS``): as requested, or for
    ``auto`` zigzag where contiguous shards would leave the work unbalanced (a causal case on several ranks
    whose largest rank would own more than :data:`BALANCED` times the mean useful FLOPs, and whose patterns
    allow zigzag), else contiguous: zigzag's rings make every step on pieces of half a shard, which a
    contiguous causal ring skips or makes on whole shards. One rank holds the whole sequence: contiguous."""
    if ranks == 1:
        return "contiguous"
    if case.placement != "auto":
        return case.placement
    if not case.causal or not zigzag_possible(case.tokens, ranks, case.patterns):
        return "contiguous"
    flops = rank_useful_flops(case.tokens, ranks, case.heads, case.head_dim, case.patterns, True)
    return "zigzag" if imbalance(flops) > BALANCED else "contiguous"


def case_layout(case: Case, ranks: int) -> Layout:
    """The serialization of ``case`` split over ``ranks`` shards (validates the distribution)."""
    placement = case_placement(case, ranks)
    check_distribution(case.tokens, ranks, case.patterns, placement=placement)
    ordering, segment = resolve_ordering(case.ordering, case.patterns, case.segment)
    return Layout(case.grid, ordering, ranks, segment, placement)


def case_schedules(case: Case, layout: Layout) -> tuple[LongSchedule, ...]:
    """The schedule of each long pattern of ``case`` on ``layout``'s ranks (``distributed.schedule``), for the
    elements the ring moves (16 bits as 2 bytes)."""
    return choose_schedules(case.patterns, layout.shards, case.heads, case.head_dim, case.head_dim,
                            precision(case.dtype).itemsize, case.long_schedule, case.pass_ != "forward")


@dataclass(frozen=True)
class CaseSetup:
    """The decisions of one case on ``ranks`` ranks."""

    case: Case
    ranks: int
    #: the serialization split over the ranks
    layout: Layout
    precision: Precision
    backend: Backend
    #: the kernel the backend runs for the case (its launches take it); None: no kernels of its own
    kernel: KernelChoice | None
    #: the ring's transport and why (``SINGLE_RANK`` on one rank); None in a plan (no communicator)
    transport: TransportChoice | None
    #: False when the kernel could not be chosen on this machine (a plan without the GPU): ``kernel`` is then the
    #: choice of the GPU nodes that needs the most memory
    decided: bool = True
    #: the backward kernel of a forward+backward case (``Backend.backward_kernel_choice``); None: none of its own
    backward_kernel: KernelChoice | None = None
    #: how each long pattern moves its K/V rows on these ranks (``distributed.schedule``; empty: none spans ranks)
    schedules: tuple[LongSchedule, ...] = ()

    @property
    def kernel_name(self) -> str:
        """The kernel as the results name it (``kernel`` attribute): 'tma16', 'wgmma', ..., or 'none'."""
        return self.kernel.name if self.kernel else "none"

    @property
    def backward_kernel_name(self) -> str:
        """The backward kernel as the results name it (``backward_kernel`` attribute): 'mma16_bwd', 'fma_bwd',
        ..., or 'none'."""
        return self.backward_kernel.name if self.backward_kernel else "none"


def check_case(case: Case, ranks: int | None = None) -> CaseSetup:
    """Everything that can be refused before any work, identically on every rank, and what ``case`` on
    ``ranks`` ranks (default ``case.ranks``) then runs with. A ConfigError names the case's parameter, checked
    in this order: distribution, backend (usable here), transport, kernel (this GPU), rank count (and pass)."""
    ranks = case.ranks if ranks is None else ranks
    layout = case_layout(case, ranks)
    be = require_usable(case.backend, f"{case.case_id}.backend").for_dtype(case.dtype)   # its side, once
    transport = SINGLE_RANK
    if ranks > 1:
        transport = choose_transport(case.transport, be.on_gpu)
        if transport.name == "cuda-aware" and not transport.cuda_aware[0]:
            raise ConfigError(f"transport 'cuda-aware' requested but the MPI library is not known to be CUDA-aware "
                              f"({transport.cuda_aware[1]}); use staged, or see 'hilbert-hpc cuda-env' "
                              f"(HILBERT_HPC_CUDA_AWARE=1 forces it)", f"{case.case_id}.transport")
    try:
        kernel = be.check(case.head_dim, case.dtype, ranks)
        backward_kernel = be.backward_kernel_choice(case.head_dim, case.dtype) if case.pass_ != "forward" else None
    except (RuntimeError, ValueError) as exc:
        raise ConfigError(str(exc), f"{case.case_id}.dtype") from None
    if ranks > 1 and case.pass_ != "forward" and be.ring_backward_kernels(backward_kernel) is None:
        raise ConfigError(f"pass = {case.pass_!r} of backend {case.backend!r} runs on one rank so far (its ring "
                          f"has no backward yet; numpy's, cuda's and cuda-fp32's have); give the case ranks = 1",
                          f"{case.case_id}.pass")
    if ranks > 1 and be.attend_fn is None:
        raise ConfigError(f"backend {case.backend!r} is the single-process baseline; run it with one rank "
                          f"or choose numpy/cupy", f"{case.case_id}.backend")
    return CaseSetup(case, ranks, layout, precision(case.dtype), be, kernel, transport,
                     backward_kernel=backward_kernel, schedules=case_schedules(case, layout))


def runnable_here(job: Job) -> tuple[Job, list[str]]:
    """``job`` without the cases of its ``optional_backends`` that cannot run on this machine (a peer that is
    not installed, no GPU), and one line per backend left out saying why."""
    unusable = {name: reason for name in job.optional_backends
                for reason in [find_backend(name, "job.optional_backends").usable()] if reason is not None}
    if not unusable:
        return job, []
    notes = [f"backend {name!r} cannot run here ({reason}): its {n} case(s) are left out (job.optional_backends)"
             for name, reason in unusable.items()
             for n in [sum(c.backend == name for c in job.cases)] if n]
    return dataclasses.replace(job, cases=tuple(c for c in job.cases if c.backend not in unusable)), notes


def plan_setup(case: Case, cc: int | None = None) -> CaseSetup:
    """The setup ``run`` will make for ``case`` (:func:`check_case`), without a transport; where this machine
    cannot run the backend (no usable GPU, a module that does not import: ``Backend.usable``), only its
    distribution is checked and the kernel is the one of the GPU nodes (Hopper's, which needs the most memory;
    ``decided`` False). ``cc``: the compute capability of the GPU the plan is for (``plan --gpu MODEL``): the
    kernel is the one ``run`` chooses there."""
    be = find_backend(case.backend, f"{case.case_id}.backend").for_dtype(case.dtype)
    if be.usable() is not None:
        layout = case_layout(case, case.ranks)
        return CaseSetup(case, case.ranks, layout, precision(case.dtype), be,
                         be.kernel_choice(case.head_dim, case.dtype, gpu_here=False, cc=cc), None, decided=False,
                         schedules=case_schedules(case, layout))
    setup = dataclasses.replace(check_case(case), transport=None)
    if cc is None:
        return setup
    return dataclasses.replace(setup, kernel=be.kernel_choice(case.head_dim, case.dtype, gpu_here=False, cc=cc))
