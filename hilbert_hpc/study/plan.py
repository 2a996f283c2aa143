"""Preflight: what each case of a job needs per rank — memory, bytes moved, FLOPs — and whether it fits.

``hilbert-hpc plan JOB.toml -n P`` prints the table without allocating
anything; ``run`` applies the same check to every case before it starts, so a
case that cannot fit is refused with the numbers instead of dying mid-job.
Memory per rank is :class:`~hilbert_hpc.study.memory.MemoryModel`'s, term by term
(``plan --breakdown`` lists them): Q, K, V and the output of every batch element,
the log-sum-exp, the backend's working memory (``Backend.memory``), the buffers
of the long patterns by their schedule (``CaseSetup.schedules``), and for a
forward+backward case dO, the gradients, the backward's working memory, the
ring backward's accumulators and the float64 gradient check. The kernel counted
is the one ``run`` chooses (``setup.plan_setup``, the same choice as the
results' ``kernel``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, Sequence, TextIO

from hilbert_hpc.core.patterns import useful_flops
from hilbert_hpc.distributed.ring import RingPattern
from hilbert_hpc.distributed.schedule import LongSchedule, block_elements
from hilbert_hpc.distributed.sharding import Shards
from hilbert_hpc.errors import ConfigError
from hilbert_hpc.study.jobfile import DEFAULT_ACCURACY_ROWS, Case, Job
from hilbert_hpc.study.memory import MemoryModel, largest_ring_block, long_patterns
from hilbert_hpc.study.setup import CaseSetup, plan_setup

GIB = float(1 << 30)


@dataclass(frozen=True)
class Estimate:
    """Per-rank needs of one case."""

    case_id: str
    ranks: int
    tokens_per_rank: int
    on_gpu: bool
    memory_bytes: int
    floor_bytes: int
    sent_bytes: int
    flops: int

    @property
    def flops_per_rank(self) -> float:
        """Useful FLOPs per rank (an even share)."""
        return self.flops / self.ranks


def _rank_sends(case: Case, shards: Shards, itemsize: int, backward: bool,
                schedules: Sequence[LongSchedule]) -> list[int]:
    """Bytes each rank sends in one forward, or with ``backward`` one backward, over the case's long patterns,
    per batch element, each by its schedule (``memory.long_patterns``). A ring pattern's rank forwards its
    blocks along the ring and, in the backward, the blocks again and the dK/dV accumulators the full ring (the
    last hop home); a gathered pattern's rank sends its block once to the ``g - 1`` others and, in the backward,
    each of them the terms of its rows (the accumulator dtype) home."""
    acc = max(itemsize, 4)
    sent = [0] * shards.ranks
    for p, kind in long_patterns(case, shards, schedules):
        if kind == "gather":
            group = shards.ring_ranks(p)
            blocks = [block_elements(p, shards, rank, case.heads, case.head_dim, case.head_dim)
                      for rank in range(shards.ranks)]
            for rank in range(shards.ranks):
                base = rank - rank % group
                others = sum(blocks[base:base + group]) - blocks[rank]
                sent[rank] += others * acc if backward else (group - 1) * blocks[rank] * itemsize
            continue
        for rank in range(shards.ranks):
            geom = RingPattern(p, shards, rank, case.heads, case.head_dim, case.head_dim)
            block = geom.block_size(geom.pos) * itemsize
            sent[rank] += sum(1 for _, send, _ in geom.schedule(case.causal) if send) * block
            if backward:      # the accumulators make the full ring, the last hop home
                sent[rank] += geom.group * geom.block_size(geom.pos) * acc
    return sent


def sent_bytes(case: Case, shards: Shards, itemsize: int, schedules: Sequence[LongSchedule] = (),
               backward: bool = False) -> int:
    """Bytes the busiest rank sends in one forward, or with ``backward`` one backward, by the ``schedules`` of the
    long patterns (a long pattern without one: ring), every batch element."""
    return max(_rank_sends(case, shards, itemsize, backward, schedules)) * case.batch


def ring_bytes(case: Case, shards: Shards, itemsize: int,
               schedules: Sequence[LongSchedule] = ()) -> tuple[int, int]:
    """(largest packed K/V block of the ring patterns in bytes, ``memory.largest_ring_block``; bytes the busiest
    rank sends per forward call, :func:`sent_bytes`) over the case's long patterns by their ``schedules``."""
    return largest_ring_block(case, shards, itemsize, schedules), sent_bytes(case, shards, itemsize, schedules)


def ring_backward_bytes(case: Case, shards: Shards, itemsize: int, schedules: Sequence[LongSchedule] = ()) -> int:
    """Bytes the busiest rank sends in one backward by the ``schedules`` of the long patterns: for a ring
    pattern (``distributed.ring_backward``) its K/V blocks again, as the forward (:func:`ring_bytes`), and
    next to them the dK/dV accumulator blocks of the same layout in the accumulator dtype, which make the full
    ring (the last hop home); for a gathered one the gradient terms of the other ranks' rows, sent home once
    (the forward's gathered rows are reused)."""
    return sent_bytes(case, shards, itemsize, schedules, backward=True)


def estimate(case: Case, torch_on_gpu: bool | None = None, setup: CaseSetup | None = None,
             accuracy_rows: int = DEFAULT_ACCURACY_ROWS) -> Estimate:
    """What ``case`` needs on each of its ``case.ranks`` ranks: the memory of
    :class:`~hilbert_hpc.study.memory.MemoryModel`, the bytes sent (:func:`sent_bytes`) and the useful FLOPs.

    ``torch_on_gpu``: whether the PyTorch peer runs on a GPU (None: as on this machine).
    ``setup``: the case's setup (``run`` passes the one it made), else :func:`~hilbert_hpc.study.setup.plan_setup`'s.
    ``accuracy_rows``: the rows of the study's float64 gradient check of a forward+backward case (0: none).
    """
    return estimate_of(MemoryModel(setup or plan_setup(case), accuracy_rows), torch_on_gpu)


def estimate_of(model: MemoryModel, torch_on_gpu: bool | None = None) -> Estimate:
    """:func:`estimate` of the case of ``model``."""
    setup, shape = model.setup, model.shape
    case = setup.case
    sent = sent_bytes(case, model.shards, shape.itemsize, setup.schedules) if shape.ranks > 1 else 0
    flops = useful_flops(case.tokens, case.heads, case.head_dim, case.patterns, case.causal, case.batch)
    return Estimate(case.case_id, shape.ranks, shape.shard, model.on_gpu(torch_on_gpu), model.total(),
                    model.qkvo(), sent, int(flops))


def available_bytes(on_gpu: bool, ranks_per_node: int = 1) -> int | None:
    """Memory one rank can use now: free GPU memory, or the host's available memory shared by the node's ranks."""
    if on_gpu:
        try:
            import cupy

            cupy.get_default_memory_pool().free_all_blocks()
            return int(cupy.cuda.runtime.memGetInfo()[0])
        except Exception:  # noqa: BLE001 - no CuPy / no GPU here (a login node): unknown
            return None
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024 // max(ranks_per_node, 1)
    except (OSError, KeyError, ValueError):
        return None


def memory_shortfall(est: Estimate, available: int | None) -> str | None:
    """Why a case whose estimate exceeds the memory available to a rank cannot fit (with the numbers); None
    where it fits or the memory is unknown."""
    if available is None or est.memory_bytes <= available:
        return None
    kind = "GPU" if est.on_gpu else "host"
    return (f"needs about {est.memory_bytes / GIB:.2f} GiB of {kind} memory per rank "
            f"({est.tokens_per_rank:,} tokens per rank on {est.ranks} rank(s); Q/K/V/O alone "
            f"{est.floor_bytes / GIB:.2f} GiB), {available / GIB:.2f} GiB are available: use more ranks "
            f"or fewer tokens")


def print_plan(job: Job, world_size: int, stream: TextIO, device_memory: int | None = None,
               host_memory: int | None = None, setups: dict[str, CaseSetup] | None = None,
               breakdown: bool = False) -> list[tuple[Estimate, str]]:
    """The plan table of ``job`` on ``world_size`` ranks; returns (estimate, verdict) rows, the verdict 'yes',
    'NO', '?' (no memory limit given) or :data:`LEFT_OUT` (an optional backend's case that does not fit:
    ``run`` leaves it out).

    With ``device_memory`` the plan is for GPU nodes: the PyTorch peer's cases count as GPU cases.
    ``setups``: each case's setup by case id (:func:`~hilbert_hpc.study.setup.plan_setup`; made here if absent).
    ``breakdown``: under each case, its memory per rank term by term (:func:`breakdown_line`).
    """
    setups = setups or {}
    rows = []
    print(f"plan: job {job.name!r} on {world_size} rank(s), {len(job.cases)} case(s)", file=stream)
    limits = [f"{kind} {limit / GIB:.2f} GiB" for kind, limit in (("GPU", device_memory), ("host", host_memory))
              if limit is not None]
    if limits:
        print(f"memory per rank: {', '.join(limits)}", file=stream)
    head = (f"{'case':<28} {'backend':<9} {'dtype':<8} {'ranks':>5} {'tokens/rank':>12} {'mem/rank GiB':>12} "
            f"{'Q/K/V/O GiB':>11} {'sent/rank MB':>12} {'GFLOP/rank':>11}  fits")
    print(head, file=stream)
    print("-" * len(head), file=stream)
    for case in job.cases:
        setup = setups.get(case.case_id) or plan_setup(case)
        model = MemoryModel(setup, job.accuracy_rows)
        est = estimate_of(model, True if device_memory is not None else None)
        limit = device_memory if est.on_gpu else host_memory
        verdict = "?" if limit is None else "yes" if memory_shortfall(est, limit) is None else \
            LEFT_OUT if case.backend in job.optional_backends else "NO"
        print(f"{case.case_id[:28]:<28} {case.backend:<9} {case.dtype:<8} {est.ranks:>5} {est.tokens_per_rank:>12,} "
              f"{est.memory_bytes / GIB:>12.3f} {est.floor_bytes / GIB:>11.3f} {est.sent_bytes / 1e6:>12.1f} "
              f"{est.flops_per_rank / 1e9:>11.1f}  {verdict}", file=stream)
        if breakdown:
            print(f"{'':<4}{breakdown_line(model)}", file=stream)
        if setup.schedules:
            print(f"{'':<4}{schedules_line(setup.schedules)}", file=stream)
        rows.append((est, verdict))
    verdicts = {v for _, v in rows}
    if "NO" in verdicts:
        print("cases marked NO do not fit: use more ranks or fewer tokens", file=stream)
    if LEFT_OUT in verdicts:
        print(f"cases marked '{LEFT_OUT}' are on optional backends (job.optional_backends): run leaves them out "
              "with a note", file=stream)
    return rows


def schedules_line(schedules: Sequence[LongSchedule]) -> str:
    """The schedule of each long pattern (``LongSchedule.describe``) on one line, for ``plan`` and the
    projection."""
    return "long patterns: " + "; ".join(s.describe() for s in schedules)


def breakdown_line(model: MemoryModel) -> str:
    """The memory per rank of ``model`` term by term (``MemoryModel.terms``, those that are not 0) with their
    sum, for ``plan --breakdown``: in GiB, or in MiB below 1 GiB."""
    unit, size = ("GiB", GIB) if model.total() >= GIB else ("MiB", float(1 << 20))
    terms = " + ".join(f"{name} {part / size:.3f}" for name, part in model.terms().items() if part)
    return f"memory {unit}: {terms} = {model.total() / size:.3f}"


#: plan's verdict on a case of an optional backend that does not fit: run leaves it out
LEFT_OUT = "NO, left out"


def unchecked_notes(job: Job, setups: dict[str, CaseSetup]) -> list[str]:
    """One note per backend of ``job`` that cannot run on this machine (a setup not ``decided``: no usable GPU,
    a module that does not import), saying why and what of its cases the plan could not check."""
    unchecked: dict[str, list[CaseSetup]] = {}
    for setup in setups.values():
        if not setup.decided:
            unchecked.setdefault(setup.backend.name, []).append(setup)
    notes = []
    for name, cases in unchecked.items():
        optional = ("; run leaves them out where it cannot run (job.optional_backends)"
                    if name in job.optional_backends else "")
        notes.append(f"backend {name!r} {cases[0].backend.usable()}: its {len(cases)} case(s) were checked for "
                     f"their distribution over the ranks only; 'run' checks their kernels and transport where the "
                     f"backend runs{optional}")
    return notes


#: size units (case-insensitive): K/M/G/T alone or with "iB" are powers of 1024 (as SLURM's --mem and
#: nvidia-smi count), with "B" alone powers of 1000 (SI); no unit or "B": bytes
SIZE_UNITS = {"": 1, "b": 1, **{f"{p}{suffix}": 1 << (10 * i) for i, p in enumerate("kmgt", 1)
                                for suffix in ("", "i", "ib")},
              **{f"{p}b": 1000 ** i for i, p in enumerate("kmgt", 1)}}
#: the largest size accepted (1 EiB): anything larger is a typo, not a machine
MAX_SIZE = 1 << 60
#: the smallest memory size accepted without a unit (1 MiB): ``--device-memory 80`` means 80 GiB, not 80 bytes
UNITLESS_MIN = 1 << 20
SIZE_HELP = ("a number with a unit: K, M, G, T or KiB, MiB, GiB, TiB are powers of 1024; KB, MB, GB, TB "
             "powers of 1000; B or none: bytes; any case, e.g. 80GiB, 16G, 512MB, '80 GB'")
_SIZE = re.compile(r"\s*((?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)\s*([a-z]*)\s*", re.IGNORECASE)


def parse_size(text: str, flag: str = "--device-memory", unitless_min: int = UNITLESS_MIN) -> int:
    """'80GiB', '16G', '512MB', '80 GB', '2000000' -> bytes (``SIZE_UNITS``); a ConfigError names ``flag``.

    Refuses what is not a positive, finite size of at most ``MAX_SIZE`` bytes
    (``nanGiB``, ``infGiB``, ``1e400GiB``, ``0``, ``-3GB``, unknown units), and a
    number without a unit below ``unitless_min`` bytes (``80``: a unit left out,
    not 80 bytes of memory; ``bandwidth --max-bytes`` takes bytes and passes 1).
    """
    found = _SIZE.fullmatch(text)
    unit = found.group(2).lower() if found else None
    if unit not in SIZE_UNITS:
        raise ConfigError(f"expected a size such as 80GiB or 512MB, got {text!r}", flag)
    value = float(found.group(1)) * SIZE_UNITS[unit]
    if not math.isfinite(value) or value > MAX_SIZE:
        raise ConfigError(f"{text!r} is not a size a machine has (the limit is {MAX_SIZE >> 60} EiB)", flag)
    if value < 1:
        raise ConfigError(f"expected a positive size such as 80GiB, got {text!r}", flag)
    if not unit and value < unitless_min:
        number = found.group(1)
        raise ConfigError(f"{text!r} has no unit, so it is {number} bytes: give the unit, e.g. {number}GiB (a number "
                          f"alone is bytes, at least {unitless_min >> 20} MiB)", flag)
    return int(value)


@dataclass(frozen=True)
class GpuModel:
    """A GPU ``plan --gpu`` knows: its memory (what nvidia-smi reports as total) and compute capability."""

    memory: int
    cc: int


#: known GPU models, for ``plan --gpu`` (on a machine without one, or for another model than this one)
GPU_MODELS = {"H100": GpuModel(81559 << 20, 90), "H200": GpuModel(143771 << 20, 90),
              "A100-80GB": GpuModel(81920 << 20, 80), "A100-40GB": GpuModel(40960 << 20, 80),
              "L40S": GpuModel(46068 << 20, 89), "V100-32GB": GpuModel(32768 << 20, 70),
              "V100-16GB": GpuModel(16384 << 20, 70)}


def gpu_model(model: str) -> GpuModel:
    """The GPU ``model`` (a key of ``GPU_MODELS``, any case); a ConfigError names ``--gpu``."""
    for name, known in GPU_MODELS.items():
        if name.lower() == model.strip().lower():
            return known
    raise ConfigError(f"unknown GPU model {model!r}; known: {', '.join(GPU_MODELS)} (or give --device-memory)",
                      "--gpu")


def check_job_fits(job: Job, comm: Any, setups: dict[str, CaseSetup]) -> tuple[Job, list[str]]:
    """Collective: ``job`` without the cases of its optional backends (``job.optional_backends``: peers) that
    do not fit the memory of their ranks, and one note per such case; refuses (on every rank) the first other
    case that does not fit.

    ``setups``: every case's setup by case id (``setup.check_case``)."""
    from hilbert_hpc.distributed.mpi import ranks_per_node

    per_node = ranks_per_node(comm)
    ests = [estimate(c, setup=setups[c.case_id], accuracy_rows=job.accuracy_rows) for c in job.cases]
    limits = {}
    for on_gpu in sorted({e.on_gpu for e in ests}):
        mine = available_bytes(on_gpu, 1 if on_gpu else per_node)
        everyone = comm.allgather(mine)
        known = [x for x in everyone if x is not None]
        limits[on_gpu] = min(known) if known else None
    kept, notes = [], []
    for case, est in zip(job.cases, ests):
        shortfall = memory_shortfall(est, limits[est.on_gpu])
        if shortfall is None:
            kept.append(case)
        elif case.backend in job.optional_backends:
            notes.append(f"case {case.case_id} of optional backend {case.backend!r} is left out: it {shortfall}")
        else:
            raise ConfigError(shortfall, f"case {case.case_id}")
    return (job if len(kept) == len(job.cases) else dataclasses.replace(job, cases=tuple(kept))), notes
