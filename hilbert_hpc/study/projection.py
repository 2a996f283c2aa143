"""Projection: a job's cases on P GPUs from measured per-GPU rates, link latency and bandwidth (``plan --project``).

For each case and GPU count P (the case's tokens split over P ranks) it reports
the memory per rank of a training step (``plan.estimate`` without the study's
float64 gradient check), whether it fits the GPU, the useful FLOPs of the
slowest rank (``core.work.rank_useful_flops`` of the case's placement: the
causal imbalance of contiguous shards included, zigzag's balance; the backward's are ``BACKWARD_FLOPS`` times the
forward's), the bytes the busiest rank sends (``plan.ring_bytes`` and ``plan.ring_backward_bytes``, each long
pattern by its schedule), the schedule of each long pattern (``CaseSetup.schedules``),
and the step time of the slowest rank by the step model (``study.step_model``: local compute, long compute,
exposed exchange, fixed per-step and per-launch costs) on the figures of ``study.step_figures`` (given, from
the ``--from`` files, or built in, each with its source), with the term that dominates.

Given results files of multi-rank cases (``--from``), :func:`check_results` projects each of
them onto its own ranks with the same figures and :func:`print_checks` sets the projected forward and
backward beside the measured medians (slowest rank), with the deviation, against ``TOLERANCE``.

It is a projection, not a measurement: the rates are those of the benchmark
problem's kernels on one GPU, the link's figures those of two GPUs of one host,
and the overlap of many GPUs is not measured. The largest N is the largest
power of two whose memory per rank, scaled linearly from the case's bytes per
token of a rank, fits the GPU (exact for every term but the long patterns'
buffers, which grow no faster than the shard).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Iterator, Sequence, TextIO, TypeVar

from hilbert_hpc.core.patterns import BACKWARD_FLOPS
from hilbert_hpc.core.work import imbalance, rank_useful_flops
from hilbert_hpc.distributed.schedule import LongSchedule
from hilbert_hpc.errors import ConfigError
from hilbert_hpc.study.gradients import backward_pass
from hilbert_hpc.study.jobfile import Case, Job
from hilbert_hpc.study.plan import GIB, estimate, ring_backward_bytes, ring_bytes, schedules_line
from hilbert_hpc.study.report_read import CaseResult
from hilbert_hpc.study.setup import plan_setup
from hilbert_hpc.study.step_figures import Figures, ran_schedules, result_case, ring_result
from hilbert_hpc.study.step_model import TERM_NAMES, FixedCost, Link, StepGeometry, Terms, slowest_rank

T = TypeVar("T")

#: ``plan --project --from``'s check: a projected time within this share of the measured one
TOLERANCE = 0.15
#: the link and fixed costs of a case whose patterns are all local (none is used)
_NO_LINK = Link("none", 0.0, math.inf, "", "")
_NO_COST = FixedCost(0.0, 0.0, "")


@dataclass(frozen=True)
class Projection:
    """One case on ``ranks`` GPUs."""

    case_id: str
    ranks: int
    tokens_per_rank: int
    memory_bytes: int
    fits: bool | None
    #: useful FLOPs of the slowest rank, forward (and backward when the case has one)
    flops: float
    imbalance: float
    #: bytes the busiest rank sends per step (forward, and backward when the case has one)
    sent_bytes: int
    #: the slowest rank's step, term by term (the backward's all 0 for pass = forward)
    forward: Terms
    backward: Terms
    schedules: tuple[LongSchedule, ...]
    #: the figures the long patterns used (None: no pattern of that kind)
    link: Link | None
    hop: FixedCost | None
    launch: FixedCost | None
    #: largest power-of-two sequence length whose memory per rank fits (None: no memory limit given)
    max_tokens: int | None

    @property
    def terms(self) -> Terms:
        """Forward and backward together."""
        return self.forward + self.backward

    @property
    def step_s(self) -> float:
        """The step time: forward and backward of the slowest rank."""
        return self.terms.total_s


def max_tokens(memory_bytes: int, shard: int, ranks: int, limit: int) -> int:
    """The largest power of two N, divisible by ``ranks``, whose memory per rank (``memory_bytes`` per ``shard``
    tokens, scaled linearly) is at most ``limit``; 0 if none."""
    per_token = memory_bytes / shard
    n = 1 << max(0, math.floor(math.log2(limit / per_token * ranks)))
    while n >= ranks and (n % ranks or per_token * n / ranks > limit):
        n >>= 1
    return n if n >= ranks and n % ranks == 0 else 0


def project(case: Case, ranks: int, figures: Figures, device_memory: int | None = None,
            cc: int | None = None) -> Projection:
    """``case``'s tokens on ``ranks`` GPUs (the module's model on ``figures``); a ConfigError if they cannot be
    split so."""
    case = dataclasses.replace(case, ranks=ranks)
    setup = plan_setup(case, cc)
    est = estimate(case, True, setup, accuracy_rows=0)
    shard = est.tokens_per_rank
    shards = setup.layout.shards
    per_rank = rank_useful_flops(case.tokens, ranks, case.heads, case.head_dim, case.patterns, case.causal,
                                 case.batch, shards.placement)
    backward = backward_pass(case)
    itemsize = setup.precision.itemsize
    sent = 0
    if ranks > 1:
        sent = ring_bytes(case, shards, itemsize, setup.schedules)[1]
        sent += ring_backward_bytes(case, shards, itemsize, setup.schedules) if backward else 0
    kinds = {s.kind for s in setup.schedules}
    rate = figures.rate_of(case)
    link = figures.link(figures.transport_of(case)) if kinds else None
    hop = figures.hop_of(case.backend) if "ring" in kinds else None
    launch = figures.launch_of(case.backend) if "gather" in kinds else None
    _, fwd, bwd = slowest_rank(StepGeometry.of(case, setup), rate.forward_tflops,
                               rate.backward_tflops if backward else None, link or _NO_LINK, hop or _NO_COST,
                               launch or _NO_COST)
    flops = float(max(per_rank)) * (1 + BACKWARD_FLOPS if backward else 1)
    fits = None if device_memory is None else est.memory_bytes <= device_memory
    top = None if device_memory is None else max_tokens(est.memory_bytes, shard, ranks, device_memory)
    return Projection(case.case_id, ranks, shard, est.memory_bytes, fits, flops, imbalance(per_rank), sent, fwd,
                      bwd, setup.schedules, link, hop, launch, top)


def project_job(job: Job, counts: Sequence[int], figures: Figures, device_memory: int | None = None,
                cc: int | None = None) -> list[tuple[Case, list[Projection | str]]]:
    """Every case of ``job`` on each of ``counts`` GPUs: a Projection, or why the case cannot be split so. The
    rate of every case is resolved first (a ConfigError before anything is printed)."""
    for case in job.cases:
        figures.rate_of(case)
    out = []
    for case in job.cases:
        rows: list[Projection | str] = []
        for p in counts:
            try:
                rows.append(project(case, p, figures, device_memory, cc))
            except ConfigError as exc:
                rows.append(f"{p:>5} cannot split the case so: {exc.message}")
        out.append((case, rows))
    return out


def figure_lines(rows: Sequence[Projection]) -> list[str]:
    """One line per link and fixed cost ``rows`` used, with its source."""
    lines = {}
    for row in rows:
        if row.link is not None:
            link = row.link
            lines[f"link {link.transport}"] = (
                f"link {link.transport}: alpha {link.alpha_s * 1e6:.3g} us ({link.alpha_source}); "
                f"B {link.gb_per_s:.4g} GB/s per rank ({link.b_source})")
        for cost, what in ((row.hop, "ring step"), (row.launch, "gathered pattern's launch")):
            if cost is not None:
                lines[f"{what} {cost.source}"] = (f"fixed cost of a {what}: forward {cost.forward_s * 1e3:.3g} ms, "
                                                  f"backward {cost.backward_s * 1e3:.3g} ms ({cost.source})")
    return list(lines.values())


def _table(head: str, rows: Sequence[T | str], stream: TextIO) -> Iterator[T]:
    """A table's column heads, underlined, then its rows: the lines (why a row is missing) printed as they are,
    the others yielded for the caller to print."""
    print(head, file=stream)
    print("-" * len(head), file=stream)
    for row in rows:
        if isinstance(row, str):
            print(row, file=stream)
        else:
            yield row


def print_projection(job: Job, counts: Sequence[int], table: list[tuple[Case, list[Projection | str]]],
                     figures: Figures, stream: TextIO, device_memory: int | None = None) -> None:
    """The projection table of :func:`project_job`'s rows."""
    print(f"projection: job {job.name!r} on {', '.join(map(str, counts))} GPU(s), {len(job.cases)} case(s); "
          f"a projection from measured per-GPU rates, not a measurement", file=stream)
    if device_memory is not None:
        print(f"memory per GPU: {device_memory / GIB:.2f} GiB", file=stream)
    for line in figure_lines([r for _, rows in table for r in rows if isinstance(r, Projection)]):
        print(line, file=stream)
    print("step of the slowest rank, forward and backward: local compute + long compute + exposed exchange + "
          "fixed costs (docs/studies.md, 'The step model'); dominant: its largest term, "
          + ", ".join(f"{short} ({long})" for short, long in TERM_NAMES.items()), file=stream)
    for case, rows in table:
        r = figures.rate_of(case)
        rates = f"forward {r.forward_tflops:g}" + (f" / backward {r.backward_tflops:g}" if backward_pass(case) else "")
        print(f"case {case.case_id}: N = {case.tokens:,}, H = {case.heads}, D = {case.head_dim}, {case.dtype}, "
              f"{'causal, ' if case.causal else ''}{case.pass_}; rate {rates} useful TFLOP/s per GPU "
              f"({r.source})", file=stream)
        head = (f"{'GPUs':>5} {'tokens/rank':>13} {'mem/rank GiB':>12} {'fits':>4} {'TFLOP slowest':>13} "
                f"{'imbal.':>6} {'sent GB/rank':>12} {'local s':>8} {'long s':>8} {'exch. ms':>8} {'fixed ms':>8} "
                f"{'fwd s':>8} {'bwd s':>8} {'step s':>8} {'dominant':>8} {'max N (memory)':>15}")
        for row in _table(head, rows, stream):
            fits = "?" if row.fits is None else "yes" if row.fits else "NO"
            top = "?" if row.max_tokens is None else f"{row.max_tokens:,}"
            t = row.terms
            print(f"{row.ranks:>5} {row.tokens_per_rank:>13,} {row.memory_bytes / GIB:>12.2f} {fits:>4} "
                  f"{row.flops / 1e12:>13.1f} {row.imbalance:>6.3f} {row.sent_bytes / 1e9:>12.3f} "
                  f"{t.local_s:>8.3f} {t.long_s:>8.3f} {t.exposed_s * 1e3:>8.2f} {t.fixed_s * 1e3:>8.2f} "
                  f"{row.forward.total_s:>8.3f} {row.backward.total_s:>8.3f} {row.step_s:>8.3f} {t.dominant:>8} "
                  f"{top:>15}", file=stream)
            if row.schedules:
                print(f"{'':<6}{schedules_line(row.schedules)}", file=stream)


@dataclass(frozen=True)
class Check:
    """A measured multi-rank case beside its projection onto its ranks."""

    result: CaseResult
    projection: Projection
    #: measured medians of the slowest rank (the backward NaN for pass = forward)
    forward_s: float
    backward_s: float

    @property
    def forward_deviation(self) -> float:
        """(projected - measured) / measured of the forward."""
        return self.projection.forward.total_s / self.forward_s - 1.0

    @property
    def backward_deviation(self) -> float:
        """(projected - measured) / measured of the backward (NaN without one)."""
        return self.projection.backward.total_s / self.backward_s - 1.0 if self.backward_s > 0 else math.nan

    @property
    def within(self) -> bool:
        """Every deviation at most ``TOLERANCE``."""
        return all(abs(d) <= TOLERANCE for d in (self.forward_deviation, self.backward_deviation)
                   if not math.isnan(d))


def result_schedule(result: CaseResult) -> str:
    """The ``long_schedule`` that gives a result's long patterns the schedules they ran with (``long_schedules``):
    ring for a ring result (:func:`ring_result`), gather when every one gathered, else the one it asked for."""
    ran = ran_schedules(result)
    if ring_result(result) or not ran:
        return "ring"
    return "gather" if set(ran) == {"gather"} else str(result.params.get("long_schedule", "auto"))


def check_results(results: Sequence[CaseResult], figures: Figures, cc: int | None = None) -> list[Check | str]:
    """Each multi-rank case of ``results`` projected onto its ranks (a :class:`Check`), or why it cannot be."""
    out: list[Check | str] = []
    for result in results:
        if result.ranks < 2:
            continue
        case = result_case(result, result_schedule(result))
        try:
            projected = project(case, result.ranks, figures, None, cc)
        except ConfigError as exc:
            out.append(f"case {result.case_id} of {result.file!r} cannot be projected: {exc.message}")
            continue
        backward = result.median("backward") if result.backward else math.nan
        out.append(Check(result, projected, result.median("attention"), backward))
    return out


def print_checks(checks: Sequence[Check | str], stream: TextIO) -> None:
    """The projected and measured forward and backward of each checked case, and the deviation."""
    print(f"check: the --from files' cases on several ranks projected onto their ranks (the figures below) against "
          f"their medians, slowest rank; deviation = projected / measured - 1; within {TOLERANCE:.0%}: every "
          f"deviation at most {TOLERANCE:.0%}", file=stream)
    for line in figure_lines([c.projection for c in checks if isinstance(c, Check)]):
        print(line, file=stream)
    head = (f"{'case':<24} {'ranks':>5} {'fwd proj ms':>11} {'fwd meas ms':>11} {'fwd dev':>8} {'bwd proj ms':>11} "
            f"{'bwd meas ms':>11} {'bwd dev':>8} {'within':>6}  file")
    for c in _table(head, checks, stream):
        p = c.projection
        bwd = (f"{p.backward.total_s * 1e3:>11.3f} {c.backward_s * 1e3:>11.3f} {c.backward_deviation:>+8.1%}"
               if not math.isnan(c.backward_deviation) else f"{'-':>11} {'-':>11} {'-':>8}")
        print(f"{c.result.case_id[:24]:<24} {p.ranks:>5} {p.forward.total_s * 1e3:>11.3f} {c.forward_s * 1e3:>11.3f} "
              f"{c.forward_deviation:>+8.1%} {bwd} {'yes' if c.within else 'NO':>6}  {c.result.file}", file=stream)
        if p.schedules:
            print(f"{'':<6}{schedules_line(p.schedules)}; dominant: {TERM_NAMES[p.terms.dominant]}", file=stream)
