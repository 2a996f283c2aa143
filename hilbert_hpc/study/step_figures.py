"""The figures the projection's step model runs on, each with its source: rates, links, fixed costs.

Each figure is, in this order, the one given on the command line, the one
``plan --project --from`` files give, or a built-in one:

- the useful TFLOP/s of one GPU (:class:`Rate`): ``--rate-tflops``; the 1-rank
  result of the case's backend, dtype, mask and D; ``RATES``;
- the latency ``alpha`` and bandwidth ``B`` of the case's transport
  (``step_model.Link``): ``--latency-us`` / ``--bandwidth-gbs``; a bandwidth
  file of that transport (``hilbert-hpc bandwidth -o``: its fit); for ``B``
  also the ring bandwidth of a 2-rank result of that transport; ``LINKS``;
- the fixed cost of a ring step of the case's backend (``step_model.FixedCost``):
  ``--hop-us``; its multi-rank ring results (:func:`hop_from_results`); ``HOP_COSTS``;
- the fixed cost of a gathered pattern's launch of the case's backend: ``--launch-us``; its
  multi-rank gather results (:func:`launch_from_results`); ``LAUNCH_COSTS``.

:class:`Figures` hands them out and remembers every built-in one it handed out,
for the notes ``plan --project --from`` prints (:meth:`Figures.notes`).
Built-in figures that are not measured say so in their source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.errors import ConfigError
from hilbert_hpc.study.bandwidth import MeasuredLink
from hilbert_hpc.study.gradients import backward_pass
from hilbert_hpc.study.jobfile import Case
from hilbert_hpc.study.report_read import CaseResult
from hilbert_hpc.study.step_model import FixedCost, Link

#: what a built-in figure that no measurement gives says of itself
NOT_MEASURED = "placeholder, not measured"


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
         ("float32", False): Rate(64.1, 32.5, _FINAL_22),
         ("float32", True): Rate(58.5, 27.7, "measured on one H200: docs/measurements/long_staged_2xh200.h5, case "
                                             "0014-longnet-2m-fp32 (N = 2M, H = 8, D = 128, causal), medians")}

_BW_STAGED = ("fitted (bandwidth.fit_latency) over 8 B .. 16 MiB, 2x H200, PyPI Open MPI 5 + UCX: "
              "docs/measurements/bw_staged.h5")
#: built-in latency and bandwidth per transport: cuda-aware and staged between two H200s of one host (NVLink)
LINKS = {
    "cuda-aware": Link("cuda-aware", 36.2e-6, 150.4,
                       "fitted (bandwidth.fit_latency) over 8 B .. 16 MiB, 2x H200, PyPI Open MPI 5 + UCX: "
                       "docs/measurements/bw_cuda_aware.h5 (B 338 GB/s there)",
                       "the K/V ring on 67 MB blocks, docs/performance.md, '2 GPUs: the K/V ring', 'Ring study vs "
                       "raw bandwidth', global-r8-262k cuda-aware, code 7ee8411"),
    "staged": Link("staged", 103.9e-6, 4.17, _BW_STAGED, _BW_STAGED),
    "host": Link("host", 10e-6, 5.0, f"{NOT_MEASURED}: host buffers between ranks of one node",
                 f"{NOT_MEASURED}: host buffers between ranks of one node"),
}

_GATHER_RUN = "measured on 2x H200, staged: docs/measurements/long_staged_2xh200.h5, {}"
_RING_RULE = "(compute_s + wait_s - the model's ring time) / steps"
_GATHER_RULE = "(compute_s + pack_s + wait_s - the model's gathered time) / gathered patterns"
#: built-in fixed cost of one ring step per backend (launches, merges, host work); other backends: cuda's
HOP_COSTS = {
    "cuda": FixedCost(0.914e-3, 2.95e-3, _GATHER_RUN.format(f"bf16 ring cases 0003, 0007: {_RING_RULE}")),
    "cuda-fp32": FixedCost(0.948e-3, 3.15e-3, _GATHER_RUN.format(f"fp32 ring cases 0013, 0017: {_RING_RULE}")),
}
#: built-in fixed cost of one gathered pattern's launch per backend (packing, the staged exchange's host work,
#: the sequence-order copy and the launch; backward: the terms' copy back and posting them home); other
#: backends: cuda's
LAUNCH_COSTS = {
    "cuda": FixedCost(1.08e-3, 1.21e-3, _GATHER_RUN.format(f"bf16 gather cases 0001, 0005: {_GATHER_RULE}")),
    "cuda-fp32": FixedCost(1.92e-3, 1.16e-3, _GATHER_RUN.format(f"fp32 gather cases 0011, 0015: {_GATHER_RULE}")),
}


def built_in_fixed(schedule: str, backend: str) -> FixedCost:
    """The built-in fixed cost of ``schedule`` on ``backend``: a ring step (``ring``, ``HOP_COSTS``) or a gathered
    pattern's launch (``gather``, ``LAUNCH_COSTS``), else backend cuda's, saying it stands in."""
    table = HOP_COSTS if schedule == "ring" else LAUNCH_COSTS
    if backend in table:
        return table[backend]
    cuda = table["cuda"]
    return FixedCost(cuda.forward_s, cuda.backward_s, f"{NOT_MEASURED} for backend {backend!r}: backend cuda's "
                                                      f"stands in ({cuda.source})")


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


def _pair(text: str, flag: str, what: str) -> tuple[float, float]:
    """'FWD' or 'FWD,BWD' as two positive numbers (the backward's is the forward's when left out)."""
    parts = text.split(",")
    if len(parts) > 2:
        raise ConfigError(f"expected FWD or FWD,BWD {what}, got {text!r}", flag)
    forward = _positive(parts[0], flag)
    return forward, _positive(parts[1], flag) if len(parts) == 2 else forward


def parse_rate(text: str, flag: str = "--rate-tflops") -> Rate:
    """'FWD' or 'FWD,BWD' useful TFLOP/s of one GPU (the backward's rate is the forward's when left out)."""
    return Rate(*_pair(text, flag, "useful TFLOP/s"), flag)


def parse_fixed_us(text: str, flag: str) -> FixedCost:
    """'FWD' or 'FWD,BWD' microseconds: a fixed cost (``--hop-us``, ``--launch-us``)."""
    forward, backward = _pair(text, flag, "microseconds")
    return FixedCost(forward / 1e6, backward / 1e6, flag)


def parse_positive(text: str, flag: str) -> float:
    """A positive number (``--bandwidth-gbs`` GB/s, ``--latency-us`` microseconds)."""
    return _positive(text, flag)


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


def result_bandwidth(results: Sequence[CaseResult], transport: str) -> tuple[float, str] | None:
    """(GB/s, source): the ring bandwidth of the 2-rank result of ``transport`` that sent the most bytes per
    call (None if there is none)."""
    rings = [r for r in results if r.ranks == 2 and r.transport == transport and float(r.metrics.ring_gb_per_s) > 0]
    if not rings:
        return None
    best = max(rings, key=lambda r: float(r.metrics.bytes_sent_per_rank))
    return float(best.metrics.ring_gb_per_s), f"{best.file}, case {best.case_id}, 2 ranks"


def result_case(result: CaseResult, long_schedule: str | None = None) -> Case:
    """The case a result ran, from its parameters (``long_schedule``: instead of the one it asked for)."""
    p = result.params
    return Case(case_id=result.case_id, name=str(p.get("name", "")), grid=tuple(int(x) for x in p["grid"]),
                patterns=tuple(Pattern(int(w), int(r)) for w, r in p["patterns"]), batch=int(p.get("batch", 1)),
                heads=int(p["heads"]), head_dim=int(p["head_dim"]), causal=bool(p.get("causal", False)),
                ordering=str(p.get("ordering", "natural")), segment=int(p.get("segment") or 0) or None,
                dtype=str(p["dtype"]), backend=str(p["backend"]), transport=str(p.get("transport", "auto")),
                ranks=result.ranks, pass_=str(p.get("pass", "forward")),
                placement=str(p.get("placement", "auto")),
                long_schedule=long_schedule or str(p.get("long_schedule", "auto")))


#: the counters that hold what each schedule's fixed cost is charged on, forward (the backward's: ``backward_``
#: ``compute_s`` and ``wait_s``, a gathered pattern's rows being the forward's)
FIXED_COUNTERS = {"ring": ("compute_s", "wait_s"), "gather": ("compute_s", "pack_s", "wait_s")}
#: what each schedule's fixed cost is charged per, and its name
FIXED_UNITS = {"ring": ("steps", "ring step"), "gather": ("gathered patterns", "gathered pattern's launch")}


def ran_schedules(result: CaseResult) -> list[str]:
    """The schedule each long pattern of ``result`` ran with (``long_schedules``: ``ring`` or ``gather``); empty
    for files without it (they ran rings) and for cases without a long pattern."""
    return [s.rsplit(": ", 1)[-1] for s in result.setup.long_schedules.split("; ") if s]


def schedule_result(result: CaseResult, schedule: str) -> bool:
    """Whether ``result`` ran on several ranks with every long pattern in ``schedule`` (``ring`` or ``gather``;
    files without ``long_schedules`` ran rings) and recorded the counters of its fixed cost
    (``FIXED_COUNTERS``)."""
    ran = ran_schedules(result)
    return (result.ranks > 1 and all(kind == schedule for kind in ran) and (bool(ran) or schedule == "ring")
            and set(FIXED_COUNTERS[schedule]) <= set(result.timings))


def ring_result(result: CaseResult) -> bool:
    """Whether ``result`` ran on several ranks with every long pattern around a ring (``long_schedules``; files
    without it ran rings) and recorded the ring's counters."""
    return schedule_result(result, "ring")


def fixed_from_results(backend: str, results: Sequence[CaseResult], figures: "Figures",
                       schedule: str) -> FixedCost | None:
    """The fixed cost of ``schedule`` (a ring step, or a gathered pattern's launch) of ``backend`` in its
    multi-rank results of that schedule (:func:`schedule_result`): over their ranks, the time its counters hold
    (``FIXED_COUNTERS``; ``backward_compute_s + backward_wait_s`` for the backward; medians over repeats) less
    what the step model gives it without fixed costs (long compute and exposed exchange), divided by the ring
    steps or gathered patterns (at least 0); None without such a result (or without a rate for one)."""
    from hilbert_hpc.study.setup import plan_setup
    from hilbert_hpc.study.step_model import StepGeometry

    counters = FIXED_COUNTERS[schedule]
    sums = {"forward": [0.0, 0], "backward": [0.0, 0]}
    used = []
    zero = FixedCost(0.0, 0.0, "")
    for result in results:
        if result.params.get("backend") != backend or not schedule_result(result, schedule):
            continue
        case = result_case(result, schedule)
        try:
            rate = figures.rate_quietly(case)
            geometry = StepGeometry.of(case, plan_setup(case))
        except ConfigError:
            continue
        if rate is None:
            continue
        link = figures.link(figures.transport_of(case, result))
        passes = [("forward", counters, rate.forward_tflops, geometry.forward_terms)]
        if result.backward and {"backward_compute_s", "backward_wait_s"} <= set(result.timings):
            passes.append(("backward", ("backward_compute_s", "backward_wait_s"), rate.backward_tflops,
                           geometry.backward_terms))
        for name, names, tflops, terms_of in passes:
            measured = sum(result.timings[c] for c in names)
            for rank in range(geometry.ranks):
                model = terms_of(rank, tflops, link, zero, zero)
                units = sum(len(lp.steps[rank]) if schedule == "ring" else 1
                            for lp in geometry.long if lp.schedule.kind == schedule) * geometry.batch
                sums[name][0] += float(np.median(measured[rank])) - (model.long_s + model.exposed_s)
                sums[name][1] += units
        used.append(result.case_id)
    if not used or not sums["forward"][1]:
        return None
    forward = max(0.0, sums["forward"][0] / sums["forward"][1])
    backward = max(0.0, sums["backward"][0] / sums["backward"][1]) if sums["backward"][1] else forward
    files = sorted({r.file for r in results if r.case_id in used})
    model = "ring" if schedule == "ring" else "gathered"
    return FixedCost(forward, backward, f"{', '.join(files)}, {schedule} case(s) {', '.join(used)}: "
                                        f"({' + '.join(counters)} - the model's {model} time) / "
                                        f"{FIXED_UNITS[schedule][0]}")


def hop_from_results(backend: str, results: Sequence[CaseResult], figures: "Figures") -> FixedCost | None:
    """The fixed cost of a ring step of ``backend`` in its multi-rank ring results (:func:`fixed_from_results`)."""
    return fixed_from_results(backend, results, figures, "ring")


def launch_from_results(backend: str, results: Sequence[CaseResult], figures: "Figures") -> FixedCost | None:
    """The fixed cost of a gathered pattern's launch of ``backend`` in its multi-rank gather results: packing
    the rank's block, waiting for the exchange, the sequence-order copy and the launch, forward; the terms, the
    copy back to rank order, posting them home and waiting for them, backward (:func:`fixed_from_results`)."""
    return fixed_from_results(backend, results, figures, "gather")


@dataclass
class Figures:
    """Every figure of the step model for the cases of one projection: the command line's (``rate``,
    ``gb_per_s``, ``alpha_s``, ``hop``, ``launch``), else the ``--from`` files' (``results``, ``links``), else
    the built-in ones; ``used`` collects a note for each built-in figure handed out."""

    rate: Rate | None = None
    gb_per_s: float | None = None
    alpha_s: float | None = None
    hop: FixedCost | None = None
    launch: FixedCost | None = None
    results: Sequence[CaseResult] = ()
    links: Sequence[MeasuredLink] = ()
    used: dict[str, str] = field(default_factory=dict)
    _fixed: dict[tuple[str, str], FixedCost | None] = field(default_factory=dict, repr=False)

    def rate_quietly(self, case: Case) -> Rate | None:
        """The rate of ``case`` (command line, 1-rank result, ``RATES``), None when there is none."""
        return self.rate or result_rate(case, self.results) or RATES.get((case.dtype, case.causal))

    def rate_of(self, case: Case) -> Rate:
        """The rate of ``case``; a ConfigError names --rate-tflops when there is none."""
        rate = self.rate_quietly(case)
        if rate is None:
            known = ", ".join(f"{d}{' causal' if c else ''}" for d, c in RATES)
            raise ConfigError(f"no measured rate for {case.dtype}{' causal' if case.causal else ''} "
                              f"(measured: {known}); give one", "--rate-tflops")
        if rate is RATES.get((case.dtype, case.causal)):
            self.used[f"rate {case.case_id}"] = (
                f"case {case.case_id}: no 1-rank result of backend {case.backend!r}, {case.dtype}, "
                f"D = {case.head_dim}, {'causal' if case.causal else 'not causal'} in the --from files: its rate "
                f"is the built-in one ({rate.source})")
        return rate

    def transport_of(self, case: Case, result: CaseResult | None = None) -> str:
        """The transport ``case`` moves its rows with: the one ``result`` used, the one it asks for, or for
        ``auto`` cuda-aware on a GPU backend (as the measured runs) and host on a CPU one."""
        from hilbert_hpc.backends import find_backend

        if result is not None and result.transport not in ("", "none", "auto"):   # old files: the one asked for
            return result.transport
        if case.transport != "auto":
            return case.transport
        return "cuda-aware" if find_backend(case.backend).on_gpu else "host"

    def link(self, transport: str) -> Link:
        """``alpha`` and ``B`` of ``transport``."""
        built = LINKS.get(transport, LINKS["cuda-aware"])
        files = [m for m in self.links if m.transport == transport]
        measured = files[-1] if files else None
        alpha, alpha_source = built.alpha_s, built.alpha_source
        if self.alpha_s is not None:
            alpha, alpha_source = self.alpha_s, "--latency-us"
        elif measured is not None:
            alpha, alpha_source = measured.fit.alpha_s, f"{measured.file}, {measured.ranks} ranks, {measured.device}"
        else:
            self.used[f"alpha {transport}"] = (f"no bandwidth file of transport {transport!r} in the --from files: "
                                               f"its latency alpha is the built-in one ({alpha_source})")
        gb, b_source = built.gb_per_s, built.b_source
        ring = result_bandwidth(self.results, transport)
        if self.gb_per_s is not None:
            gb, b_source = self.gb_per_s, "--bandwidth-gbs"
        elif measured is not None:
            gb, b_source = measured.fit.gb_per_s, f"{measured.file}, {measured.ranks} ranks, {measured.device}"
        elif ring is not None:
            gb, b_source = ring
        else:
            self.used[f"B {transport}"] = (f"no bandwidth file or 2-rank result of transport {transport!r} in the "
                                           f"--from files: its bandwidth B is the built-in one ({b_source})")
        return Link(transport, alpha, gb, alpha_source, b_source)

    def fixed_of(self, schedule: str, backend: str) -> FixedCost:
        """The fixed cost of ``schedule`` on ``backend``: a ring step (``ring``) or a gathered pattern's launch
        (``gather``)."""
        given = self.hop if schedule == "ring" else self.launch
        if given is not None:
            return given
        if (schedule, backend) not in self._fixed:
            self._fixed[schedule, backend] = fixed_from_results(backend, self.results, self, schedule)
        found = self._fixed[schedule, backend]
        if found is None:
            found = built_in_fixed(schedule, backend)
            name, flag = FIXED_UNITS[schedule][1], "--hop-us" if schedule == "ring" else "--launch-us"
            self.used[f"{schedule} {backend}"] = (
                f"no multi-rank {schedule} result of backend {backend!r} in the --from files: the fixed cost of its "
                f"{name} is the built-in one ({found.source}; {flag} gives it)")
        return found

    def hop_of(self, backend: str) -> FixedCost:
        """The fixed cost of a ring step of ``backend``."""
        return self.fixed_of("ring", backend)

    def launch_of(self, backend: str) -> FixedCost:
        """The fixed cost of a gathered pattern's launch on ``backend``."""
        return self.fixed_of("gather", backend)

    def notes(self) -> list[str]:
        """One line per built-in figure handed out."""
        return list(self.used.values())
