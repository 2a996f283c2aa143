"""Projection: a job's cases on P GPUs, from per-GPU rates measured on one and two GPUs (``plan --project``).

For each case and GPU count P (the case's tokens split over P ranks) it reports
the memory per rank of a training step (``plan.estimate`` without the study's
float64 gradient check), whether it fits the GPU, the useful FLOPs of the
slowest rank (``core.work.rank_useful_flops`` of the case's placement: the
causal imbalance of contiguous shards included, zigzag's balance; the backward's are ``BACKWARD_FLOPS`` times the
forward's), the bytes the busiest rank sends around its rings (the forward's
K/V blocks, and for forward+backward the ring backward's, ``plan.ring_backward_bytes``)
and a projected step time:

    compute = F_fwd / R_fwd (+ BACKWARD_FLOPS * F_fwd / R_bwd),  comm = bytes / B,
    step between max(compute, comm) (the exchanges hidden behind the kernels)
    and compute + comm (none hidden),

with ``R`` the measured useful TFLOP/s of one GPU (``RATES``) and ``B`` the
measured ring bandwidth (``BANDWIDTH``), both overridable, or read from the
results files of 1- and 2-rank runs (``plan --from``: the medians of the
1-rank case of the same backend, dtype, mask and D; the ring bandwidth of the
2-rank case that sent the most; a note names each figure the files do not give,
for which the built-in one stands in: :func:`built_in_notes`). It is a
projection from single-GPU rates and a 2-GPU ring, not a measurement: the rates
are those of the benchmark problem's kernels, the bandwidth that of NVLink
between two GPUs of one host, and the overlap of many GPUs is not measured.
The largest N is the largest power of two whose memory per rank, scaled
linearly from the case's bytes per token of a rank, fits the GPU (exact for
every term but the ring's blocks, which grow no faster than the shard).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence, TextIO

from hilbert_hpc.core.patterns import BACKWARD_FLOPS
from hilbert_hpc.core.work import imbalance, rank_useful_flops
from hilbert_hpc.errors import ConfigError
from hilbert_hpc.study.gradients import backward_pass
from hilbert_hpc.study.jobfile import Case, Job
from hilbert_hpc.study.plan import GIB, estimate, ring_backward_bytes, ring_bytes
from hilbert_hpc.study.report_read import CaseResult
from hilbert_hpc.study.setup import plan_setup


@dataclass(frozen=True)
class Rate:
    """Useful TFLOP/s of one GPU, forward and backward, and where the figures come from."""

    forward_tflops: float
    backward_tflops: float
    source: str


_FINAL_22 = "docs/performance.md, '1 GPU: forward and backward ..., final kernels of issue 22', H200, code 492e50d"
#: measured useful TFLOP/s of one H200 by (dtype, causal): the benchmark problem (N = 262,144, H = 12, D = 64,
#: patterns (2048,1) (4096,2) (8192,4)), its useful FLOPs over the medians 9.96 / 31.01 ms (bf16), 7.25 /
#: 21.81 ms (bf16 causal), 45.00 / 221.80 ms (float32)
RATES = {("bfloat16", False): Rate(290.0, 233.0, _FINAL_22),
         ("bfloat16", True): Rate(199.0, 165.0, _FINAL_22),
         ("float32", False): Rate(64.1, 32.5, _FINAL_22)}


@dataclass(frozen=True)
class Bandwidth:
    """Bytes per second one rank sends around its ring, and where the figure comes from."""

    gbs: float
    source: str


#: the K/V ring's measured bandwidth between two H200s of one host (cuda-aware, 67 MB blocks; raw exchanges of
#: 256 MiB reach 359 GB/s)
BANDWIDTH = Bandwidth(150.4, "docs/performance.md, '2 GPUs: the K/V ring', 'Ring study vs raw bandwidth', "
                             "global-r8-262k cuda-aware, code 7ee8411")


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
    ring_bytes: int
    compute_s: float
    comm_s: float
    #: largest power-of-two sequence length whose memory per rank fits (None: no memory limit given)
    max_tokens: int | None

    @property
    def overlapped_s(self) -> float:
        """Step time with the exchanges hidden behind the kernels."""
        return max(self.compute_s, self.comm_s)

    @property
    def serial_s(self) -> float:
        """Step time with no exchange hidden."""
        return self.compute_s + self.comm_s


def parse_counts(text: str, flag: str = "--project") -> list[int]:
    """'8,16,32' -> [8, 16, 32]: GPU counts, each at least 1; a ConfigError names ``flag``."""
    try:
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        raise ConfigError(f"expected GPU counts such as 8,16,32,64, got {text!r}", flag) from None
    if any(p < 1 for p in counts):
        raise ConfigError(f"expected GPU counts >= 1, got {text!r}", flag)
    return counts


def _positive(text: str, flag: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"expected a positive number, got {text!r}", flag)
    return value


def parse_rate(text: str, flag: str = "--rate-tflops") -> Rate:
    """'FWD' or 'FWD,BWD' useful TFLOP/s of one GPU (the backward's rate is the forward's when left out)."""
    parts = text.split(",")
    if len(parts) > 2:
        raise ConfigError(f"expected FWD or FWD,BWD useful TFLOP/s, got {text!r}", flag)
    forward = _positive(parts[0], flag)
    return Rate(forward, _positive(parts[1], flag) if len(parts) == 2 else forward, flag)


def parse_bandwidth(text: str, flag: str = "--bandwidth-gbs") -> Bandwidth:
    """'150' -> the ring bandwidth in GB/s a rank sends at."""
    return Bandwidth(_positive(text, flag), flag)


def _same_kernel(result: CaseResult, case: Case) -> bool:
    params = result.params
    return (params.get("backend"), params.get("dtype"), bool(params.get("causal")), params.get("head_dim")) == (
        case.backend, case.dtype, case.causal, case.head_dim)


def result_rate(case: Case, results: Sequence[CaseResult]) -> Rate | None:
    """The median useful TFLOP/s of the 1-rank result of ``case``'s backend, dtype, mask and D (the longest
    one), forward and backward (NaN without a backward); None if there is none. A ConfigError names ``--from``
    when ``case`` has a backward and the result does not."""
    same = [r for r in results if r.ranks == 1 and _same_kernel(r, case)]
    if not same:
        return None
    best = max(same, key=lambda r: r.tokens)
    backward = float(best.metrics.backward_useful_tflops)
    if backward_pass(case) and not backward > 0:
        raise ConfigError(f"case {best.case_id} of {best.file!r}, the 1-rank result of {case.case_id}'s kernel, "
                          f"has no backward: run it with pass = \"forward+backward\"", "--from")
    return Rate(float(best.metrics.useful_tflops), backward,
                f"{best.file}, case {best.case_id}, medians of {best.repeats}")


def result_bandwidth(results: Sequence[CaseResult]) -> Bandwidth | None:
    """The ring bandwidth of the 2-rank result that sent the most bytes per call (None if there is none)."""
    rings = [r for r in results if r.ranks == 2 and float(r.metrics.ring_gb_per_s) > 0]
    if not rings:
        return None
    best = max(rings, key=lambda r: float(r.metrics.bytes_sent_per_rank))
    return Bandwidth(float(best.metrics.ring_gb_per_s), f"{best.file}, case {best.case_id}, 2 ranks")


def rate_for(case: Case, override: Rate | None, results: Sequence[CaseResult] = ()) -> Rate:
    """``override``, else the rate of ``results`` (:func:`result_rate`), else the measured rate of the case's
    dtype and mask (``RATES``); a ConfigError names --rate-tflops when there is none."""
    rate = override or result_rate(case, results) or RATES.get((case.dtype, case.causal))
    if rate is None:
        known = ", ".join(f"{d}{' causal' if c else ''}" for d, c in RATES)
        raise ConfigError(f"no measured rate for {case.dtype}{' causal' if case.causal else ''} "
                          f"(measured: {known}); give one", "--rate-tflops")
    return rate


def bandwidth_for(override: Bandwidth | None, results: Sequence[CaseResult] = ()) -> Bandwidth:
    """``override``, else the ring bandwidth of ``results`` (:func:`result_bandwidth`), else ``BANDWIDTH``."""
    return override or result_bandwidth(results) or BANDWIDTH


def built_in_notes(job: Job, counts: Sequence[int], results: Sequence[CaseResult], rate: Rate | None = None,
                   bandwidth: Bandwidth | None = None) -> list[str]:
    """What the results files of ``plan --from`` (``results``) do not give, so that a built-in figure stands in
    (:func:`rate_for`, :func:`bandwidth_for`): one note per case of ``job`` that takes its rate from ``RATES``,
    one when the ring bandwidth of a projection onto ``counts`` GPUs (more than one) is ``BANDWIDTH``."""
    notes = []
    for case in job.cases:
        built_in = RATES.get((case.dtype, case.causal))
        if rate_for(case, rate, results) is built_in:      # refuses, as the table would, a case without a rate
            notes.append(f"case {case.case_id}: no 1-rank result of backend {case.backend!r}, {case.dtype}, "
                         f"D = {case.head_dim}, {'causal' if case.causal else 'not causal'} in the --from files: "
                         f"its rate is the built-in one ({built_in.source})")
    if max(counts) > 1 and bandwidth_for(bandwidth, results) is BANDWIDTH:
        notes.append(f"no 2-rank result in the --from files: the ring bandwidth is the built-in one "
                     f"({BANDWIDTH.source})")
    return notes


def max_tokens(memory_bytes: int, shard: int, ranks: int, limit: int) -> int:
    """The largest power of two N, divisible by ``ranks``, whose memory per rank (``memory_bytes`` per ``shard``
    tokens, scaled linearly) is at most ``limit``; 0 if none."""
    per_token = memory_bytes / shard
    n = 1 << max(0, math.floor(math.log2(limit / per_token * ranks)))
    while n >= ranks and (n % ranks or per_token * n / ranks > limit):
        n >>= 1
    return n if n >= ranks and n % ranks == 0 else 0


def project(case: Case, ranks: int, rate: Rate, bandwidth: Bandwidth, device_memory: int | None,
            cc: int | None = None) -> Projection:
    """``case``'s tokens on ``ranks`` GPUs (the module's model); a ConfigError if they cannot be split so."""
    case = dataclasses.replace(case, ranks=ranks)
    setup = plan_setup(case, cc)
    est = estimate(case, True, setup, accuracy_rows=0)
    shard = est.tokens_per_rank
    shards = setup.layout.shards
    per_rank = rank_useful_flops(case.tokens, ranks, case.heads, case.head_dim, case.patterns, case.causal,
                                 case.batch, shards.placement)
    forward = max(per_rank)
    compute = forward / (rate.forward_tflops * 1e12)
    itemsize = setup.precision.itemsize
    if ranks == 1:
        sent = 0
    elif backward_pass(case):
        sent = ring_bytes(case, shards, itemsize)[1] + ring_backward_bytes(case, shards, itemsize)
    else:
        sent = ring_bytes(case, shards, itemsize)[1]
    flops = float(forward)
    if backward_pass(case):
        compute += BACKWARD_FLOPS * forward / (rate.backward_tflops * 1e12)
        flops *= 1 + BACKWARD_FLOPS
    fits = None if device_memory is None else est.memory_bytes <= device_memory
    top = None if device_memory is None else max_tokens(est.memory_bytes, shard, ranks, device_memory)
    return Projection(case.case_id, ranks, shard, est.memory_bytes, fits, flops, imbalance(per_rank), sent,
                      compute, sent / (bandwidth.gbs * 1e9), top)


def print_projection(job: Job, counts: Sequence[int], stream: TextIO, device_memory: int | None = None,
                     rate: Rate | None = None, bandwidth: Bandwidth | None = None,
                     cc: int | None = None, results: Sequence[CaseResult] = ()) -> list[Projection]:
    """The projection table of every case of ``job`` on each of ``counts`` GPUs; returns its rows.

    ``rate`` / ``bandwidth``: overrides of ``RATES`` / ``BANDWIDTH``; ``cc``: the GPU's compute capability;
    ``results``: cases of results files of 1- and 2-rank runs, whose rates come before the defaults."""
    bandwidth = bandwidth_for(bandwidth, results)
    rows = []
    print(f"projection: job {job.name!r} on {', '.join(map(str, counts))} GPU(s), {len(job.cases)} case(s); "
          f"a projection from measured per-GPU rates, not a measurement", file=stream)
    if device_memory is not None:
        print(f"memory per GPU: {device_memory / GIB:.2f} GiB", file=stream)
    print(f"ring bandwidth: {bandwidth.gbs:g} GB/s per rank ({bandwidth.source})", file=stream)
    print("step: max(compute, comm) with the exchanges hidden .. compute + comm with none hidden", file=stream)
    for case in job.cases:
        r = rate_for(case, rate, results)
        rates = f"forward {r.forward_tflops:g}" + (f" / backward {r.backward_tflops:g}" if backward_pass(case) else "")
        print(f"case {case.case_id}: N = {case.tokens:,}, H = {case.heads}, D = {case.head_dim}, {case.dtype}, "
              f"{'causal, ' if case.causal else ''}{case.pass_}; rate {rates} useful TFLOP/s per GPU "
              f"({r.source})", file=stream)
        head = (f"{'GPUs':>5} {'tokens/rank':>13} {'mem/rank GiB':>12} {'fits':>4} {'TFLOP slowest':>13} "
                f"{'imbal.':>6} {'ring GB/rank':>12} {'compute s':>9} {'comm ms':>8} {'step s':>17} "
                f"{'max N (memory)':>15}")
        print(head, file=stream)
        print("-" * len(head), file=stream)
        for p in counts:
            try:
                row = project(case, p, r, bandwidth, device_memory, cc)
            except ConfigError as exc:
                print(f"{p:>5} cannot split the case so: {exc.message}", file=stream)
                continue
            fits = "?" if row.fits is None else "yes" if row.fits else "NO"
            top = "?" if row.max_tokens is None else f"{row.max_tokens:,}"
            step = f"{row.overlapped_s:.3f}..{row.serial_s:.3f}"
            print(f"{p:>5} {row.tokens_per_rank:>13,} {row.memory_bytes / GIB:>12.2f} {fits:>4} "
                  f"{row.flops / 1e12:>13.1f} {row.imbalance:>6.3f} {row.ring_bytes / 1e9:>12.3f} "
                  f"{row.compute_s:>9.3f} {row.comm_s * 1e3:>8.2f} {step:>17} {top:>15}", file=stream)
            rows.append(row)
    return rows
