"""Measurement of one case on this rank: inputs, accuracy against float64, timed calls, metrics.

Each rank makes only its own shard of the inputs (counter-based, a function of
the seed and the natural position), runs the timed calls (:class:`CaseRun`, with
the case's setup: backend, kernel, transport, decided once by
``setup.check_case``) and measures its share of the sampled accuracy rows;
:func:`derive_metrics` and :func:`judge_accuracy` turn every rank's figures into
the case's numbers. The runner (``runner.py``) orchestrates the cases;
``maxlen.py`` reuses the inputs and the accuracy check for its trials.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from hilbert_hpc.core import device_memory
from hilbert_hpc.distributed.datafile import read_shard
from hilbert_hpc.core.inputs import random_rows
from hilbert_hpc.study.jobfile import Case, Job
from hilbert_hpc.study.record import PHASES, RING_BACKWARD_STATS, RING_STATS, SAVED, Timings, names
from hilbert_hpc.core.patterns import BACKWARD_FLOPS, useful_flops
from hilbert_hpc.core.work import imbalance, rank_useful_flops
from hilbert_hpc.core.precision import precision
from hilbert_hpc.core.reference import reference_rows, sample_selected_rows, selected_heads
from hilbert_hpc.distributed.ring import RingStats, ring_dilated_forward, ring_transfer_only
from hilbert_hpc.distributed.ring_backward import ring_dilated_backward
from hilbert_hpc.distributed.sharding import IndexView, Layout
from hilbert_hpc.study.gradients import GRADIENTS, backward_pass, gradient_accuracy, gradient_fields
from hilbert_hpc.study.error_sums import combined, error_sums, relative_errors
from hilbert_hpc.study.reference_inputs import row_source
from hilbert_hpc.study.setup import CaseSetup


def generation_module(on_gpu: bool) -> Any:
    """Where random inputs are made: CuPy on a GPU backend when a GPU is present, else NumPy."""
    if on_gpu:
        try:
            import cupy

            if cupy.cuda.runtime.getDeviceCount() > 0:
                return cupy
        except Exception:  # noqa: BLE001 - no CuPy or no usable GPU: make them on the host
            pass
    return np


def shard_inputs(case: Case, seed: int, layout: Layout, comm: Any, batch_index: int, xp: Any = np) -> list[Any]:
    """This rank's Q, K, V shard of one batch element, already in serialized order.

    From the case's input file (redistributed in parallel), else counter-based
    random rows, made directly in ``xp`` (the same values on the host and on a GPU).
    """
    prec = precision(case.dtype)
    if case.input:
        return [read_shard(case.input, t, batch_index, layout, comm, prec.host_dtype()) for t in ("q", "k", "v")]
    positions = batch_index * case.tokens + layout.shard_natural(comm.Get_rank())
    return [random_rows(seed, t, positions, case.heads, case.head_dim, prec.generation_dtype(), xp)
            for t in ("q", "k", "v")]


def backend_inputs(setup: CaseSetup, seed: int, comm: Any, batch_index: int) -> list[Any]:
    """This rank's Q, K, V shard as the case's backend computes with them (its arrays, the case's dtype).

    16-bit random inputs are made a chunk of rows at a time, each chunk rounded as
    it reaches the backend, so their float32 values never exist whole on the device
    (a 16-bit sequence can then be twice as long as a float32 one). Other inputs
    are made as ``shard_inputs`` makes them; the backend's ``to_device`` is then a
    no-op in the timed calls.
    """
    case, layout, be = setup.case, setup.layout, setup.backend
    xp = generation_module(be.on_gpu)
    if case.input or not setup.precision.sixteen_bit:
        return shard_inputs(case, seed, layout, comm, batch_index, xp)
    positions = batch_index * case.tokens + layout.shard_natural(comm.Get_rank())
    return [_made_rows(setup, seed, t, positions, xp) for t in ("q", "k", "v")]


def dout_shard(setup: CaseSetup, seed: int, comm: Any, batch_index: int) -> Any:
    """This rank's loss gradient dO of one batch element, serialized, as the backend computes with it: made
    from the seed like the random inputs, where they are made (on the GPU for a GPU backend), also for cases
    that read Q, K, V from a file."""
    case, be = setup.case, setup.backend
    positions = batch_index * case.tokens + setup.layout.shard_natural(comm.Get_rank())
    rows = _made_rows(setup, seed, "do", positions, generation_module(be.on_gpu))
    return rows if setup.precision.sixteen_bit else be.to_device(rows, case.dtype)


def _made_rows(setup: CaseSetup, seed: int, tensor: str, positions: np.ndarray, xp: Any) -> Any:
    """Random rows of ``tensor`` for natural ``positions`` in ``xp``; 16-bit ones a chunk of rows at a time, each
    chunk rounded as it reaches the backend."""
    from hilbert_hpc.core.arrays import concatenate
    from hilbert_hpc.core.inputs import CHUNK_ELEMENTS

    case, prec = setup.case, setup.precision
    if not prec.sixteen_bit:
        return random_rows(seed, tensor, positions, case.heads, case.head_dim, prec.generation_dtype(), xp)
    step = max(1, CHUNK_ELEMENTS // (case.heads * case.head_dim))
    return concatenate([setup.backend.to_device(random_rows(seed, tensor, positions[i:i + step], case.heads,
                                                            case.head_dim, np.float32, xp), case.dtype)
                        for i in range(0, len(positions), step)])


def local_accuracy(case: Case, seed: int, rows: int, output: Any, layout: Layout, rank: int) -> dict:
    """Error sums of the sampled rows (batch element 0) that this rank owns, against float64.

    The rows are drawn among those some pattern selects (``sample_selected_rows``,
    the same rows on any rank count); every head of a sampled row is compared, and
    ``selected_pairs`` counts the (row, head) pairs of them that a pattern selects
    (the others must be 0). ``output`` is this rank's serialized output shard, or
    anything indexed like it that returns host rows (``arrays.RowReader`` over a
    device array).
    """
    serial = sample_selected_rows(case.tokens, case.heads, case.patterns, rows, seed)
    mine = layout.owner(serial) == rank
    serial = serial[mine]
    result = {"selected_pairs": int(selected_heads(serial, case.heads, case.patterns).sum()),
              **error_sums(np.empty(0), np.empty(0))}
    if not serial.size:
        return result
    picked = layout.natural_of(serial)

    ref = reference_rows(picked, source=row_source(case, seed), perm=IndexView(layout.natural_of),
                         inverse=IndexView(layout.serialized_of), heads=case.heads, patterns=case.patterns,
                         causal=case.causal, scale=case.softmax_scale)
    got = np.asarray(output[layout.local_rows(serial)], dtype=np.float64)
    result.update(error_sums(got, ref))
    return result


def combine_accuracy(parts: list[dict]) -> dict[str, float]:
    """Global accuracy from every rank's error sums (and counts of NaN/Inf outputs).

    ``rows`` and ``selected_pairs`` say what the error figures rest on: the
    sampled rows, and their (row, head) pairs that some pattern selects.
    """
    sums = combined(parts)
    pairs = sum(p.get("selected_pairs", 0) for p in parts)
    nonfinite = sum(p.get("nonfinite", 0) for p in parts)
    if sums["rows"] == 0:
        return {"rows": 0, "selected_pairs": 0, "nonfinite": nonfinite, "max_abs_err": np.nan,
                "max_rel_err": np.nan, "rel_l2_err": np.nan}
    max_rel, rel_l2 = relative_errors(sums)
    return {"rows": sums["rows"], "selected_pairs": pairs, "nonfinite": nonfinite, "max_abs_err": sums["max_abs"],
            "max_rel_err": max_rel, "rel_l2_err": rel_l2}

def judge_accuracy(case: Case, parts: list[dict]) -> dict:
    """The case's accuracy from every rank's error sums (:func:`combine_accuracy`; the gradients' from the sums
    of :func:`~hilbert_hpc.study.gradients.gradient_accuracy` under ``"grads"``, NaN without a backward), with
    its dtype's tolerance and whether the output and gradients are within it; a warning on stderr when the
    output or gradients hold NaN/Inf or an error exceeds the tolerance."""
    accuracy = combine_accuracy(parts)
    accuracy.update(gradient_fields(next((p["grads"] for p in parts if p.get("grads")), None)))
    tol = precision(case.dtype).tolerance
    errors = {"output": accuracy["max_rel_err"] if accuracy["rows"] else 0.0}
    errors.update((f"d{t.upper()}", accuracy[f"grad_{t}_max_rel_err"]) for t in GRADIENTS
                  if not np.isnan(accuracy[f"grad_{t}_max_rel_err"]))
    which, worst = max(errors.items(), key=lambda e: e[1])
    accuracy.update(tolerance=tol, within_tolerance=bool(accuracy["nonfinite"] == 0 and worst <= tol))
    what = "output and gradients" if backward_pass(case) else "output"
    if accuracy["nonfinite"]:
        print(f"hilbert-hpc: warning: case {case.case_id}: the {what} hold{'s' * (what == 'output')} "
              f"{accuracy['nonfinite']:,} NaN or infinite value(s)", file=sys.stderr, flush=True)
    elif not accuracy["within_tolerance"]:
        print(f"hilbert-hpc: warning: case {case.case_id}: max relative error {worst:.2e} ({which}) against "
              f"float64 exceeds the {case.dtype} tolerance {tol:g}", file=sys.stderr, flush=True)
    return accuracy


class CaseRun:
    """One case on this rank: its setup (backend, kernel, transport), the shard, and the timed repeats."""

    def __init__(self, setup: CaseSetup, job: Job, comm: Any) -> None:
        from hilbert_hpc.distributed.transports import open_transport

        self.setup, self.case, self.job, self.comm = setup, setup.case, job, comm
        self.rank, self.ranks = comm.Get_rank(), comm.Get_size()
        self.be = setup.backend
        self.layout = setup.layout
        self.transport = open_transport(setup.transport, comm) if self.ranks > 1 else None
        #: the case's providers and array views around the ring (``Backend.ring_side``), decided once
        self.side = (self.be.ring_side(self.case.dtype, setup.kernel, setup.backward_kernel,
                                       backward_pass(self.case)) if self.ranks > 1 else None)
        #: calls made so far, and the seconds this case's own work took (inputs and calls)
        self.rep, self.elapsed_s = 0, 0.0
        #: the forward's gathered long-pattern rows, for the backward of the same call (ring_dilated_forward)
        self.gathered: dict | None = None

    def attention(self, qs: Any, ks: Any, vs: Any, stats: RingStats) -> Any:
        """Dilated attention of this rank's shard (the whole sequence on one rank); with a backward, the
        output and its merged log-sum-exp."""
        c = self.case
        if self.ranks == 1 and backward_pass(c):
            return self.be.serialized_forward(qs, ks, vs, c.patterns, c.causal, c.softmax_scale, self.setup.kernel)
        if self.ranks == 1:
            return self.be.serialized_attention(qs, ks, vs, c.patterns, c.causal, c.softmax_scale,
                                                self.setup.kernel)
        self.gathered = {} if backward_pass(c) else None
        out, lse = ring_dilated_forward(qs, ks, vs, patterns=c.patterns, comm=self.comm, causal=c.causal,
                                        scale=c.softmax_scale, transport=self.transport,
                                        stats=stats, sync_rings=True,
                                        kernels=self.side.forward, placement=self.layout.placement,
                                        schedule=self.setup.schedules, gathered=self.gathered)
        out = self.side.output(out)
        return (out, lse) if backward_pass(c) else out

    def backward(self, qs: Any, ks: Any, vs: Any, out: Any, lse: Any, dout: Any, stats: RingStats) -> Any:
        """Gradients (dQ, dK, dV) of this rank's shard: the backend's backward on one rank, the ring backward
        with the backward provider of the case's ring side on several, its gradients as the backend's own
        (the side's ``gradients``) and its counters added to ``stats`` (kept apart from the forward ring's)."""
        c = self.case
        if self.ranks == 1:
            return self.be.serialized_backward(qs, ks, vs, out, lse, dout, c.patterns, c.causal, c.softmax_scale,
                                               self.setup.backward_kernel)
        grads = ring_dilated_backward(qs, ks, vs, out, lse, dout, patterns=c.patterns, comm=self.comm,
                                      causal=c.causal, scale=c.softmax_scale, transport=self.transport,
                                      kernels=self.side.backward,
                                      stats=stats, sync_rings=True, placement=self.layout.placement,
                                      schedule=self.setup.schedules, gathered=self.gathered)
        self.gathered = None
        return self.side.gradients(grads)

    def run(self) -> tuple[dict, dict[str, list[np.ndarray]], dict]:
        """Warm-up and timed repeats; returns (per-repeat timings, host outputs, accuracy sums).

        The accuracy check comes first: the output of the first call (a warm-up
        when there is one) is compared with float64 on the sampled rows, and all
        of it is checked for NaN/Inf, before the timed repeats run. Outputs stay
        where the backend made them: only the sampled rows come to the host, and
        the whole output (and the gradients of a forward+backward case) only when
        the job saves it (then every repeat copies them, timed as ``unserialize``;
        the host outputs returned are the last repeat's, by name of ``record.SAVED``,
        one array per batch element).
        """
        self.start()
        while not self.done:
            self.step()
        return self.results()

    @property
    def calls(self) -> int:
        """Warm-up and timed repeats in all."""
        return self.job.warmup + self.job.repeats

    @property
    def done(self) -> bool:
        """True when every warm-up and timed repeat has run."""
        return self.rep >= self.calls

    def start(self) -> "CaseRun":
        """Make this rank's inputs (kept until ``results``) and reset the device memory peak; returns itself."""
        t0 = time.perf_counter()
        c = self.case
        self.inputs = [backend_inputs(self.setup, self.job.seed, self.comm, b) for b in range(c.batch)]
        self.douts = [dout_shard(self.setup, self.job.seed, self.comm, b) if backward_pass(c) else None
                      for b in range(c.batch)]
        device_memory.reset_peak()
        self.timings: dict[str, list[float]] = {name: [] for name in names(Timings)}
        self.useful_flops = float(rank_useful_flops(c.tokens, self.ranks, c.heads, c.head_dim, c.patterns, c.causal,
                                                    c.batch, self.layout.placement)[self.rank])
        self.outputs: dict[str, list[np.ndarray]] = {}
        self.accuracy: dict = {}
        self.rep = 0
        self.elapsed_s = time.perf_counter() - t0
        return self

    def step(self) -> None:
        """The next call (warm-up or timed repeat) on every batch element; the first one also checks accuracy."""
        from hilbert_hpc.core.arrays import RowReader, count_nonfinite

        started = time.perf_counter()
        c, job, be, rep = self.case, self.job, self.be, self.rep
        phase_s = dict.fromkeys(PHASES, 0.0)
        stats, backward_stats = RingStats(), RingStats()
        transfer_only = 0.0
        self.outputs = {}
        nonfinite = 0
        self.comm.Barrier()
        for b, (q, k, v) in enumerate(self.inputs):
            t0 = time.perf_counter()
            qs, ks, vs = (be.to_device(x, c.dtype) for x in (q, k, v))
            if self.ranks > 1:
                qs, ks, vs = (self.side.view(x) for x in (qs, ks, vs))
            be.synchronize()
            t1 = time.perf_counter()
            result = self.attention(qs, ks, vs, stats)
            out_s, lse = result if backward_pass(c) else (result, None)
            del result
            be.synchronize()
            t2 = t3 = time.perf_counter()
            grads = []
            if backward_pass(c):
                grads = self.backward(qs, ks, vs, out_s, lse, self.douts[b], backward_stats)
                be.synchronize()
                t3 = time.perf_counter()
            if job.save_output:
                for name, x in zip(SAVED, (out_s, *grads)):
                    self.outputs.setdefault(name, []).append(be.to_numpy(x))
            t4 = time.perf_counter()
            phase_s["serialize"] += t1 - t0
            phase_s["attention"] += t2 - t1
            phase_s["backward"] += t3 - t2
            phase_s["unserialize"] += t4 - t3
            phase_s["total"] += t4 - t0
            if rep == 0:
                # checked before anything is timed: the first call's output against float64, all of it finite
                nonfinite += count_nonfinite(out_s) + sum(count_nonfinite(g) for g in grads)
                if b == 0:
                    self.accuracy = self._agreed_accuracy(RowReader(out_s))
                    if grads:
                        self.accuracy["grads"] = gradient_accuracy(self.setup, job.seed, job.accuracy_rows,
                                                                   grads, self.comm)
            del out_s, lse, grads          # before the next call allocates its output
            if self.ranks > 1:
                self.comm.Barrier()
                transfer_only += ring_transfer_only(ks, vs, patterns=c.patterns, comm=self.comm,
                                                    causal=c.causal, transport=self.transport,
                                                    placement=self.layout.placement,
                                                    schedule=self.setup.schedules).wait_s
        if rep == 0:
            self.accuracy["nonfinite"] = nonfinite
        if rep >= job.warmup:
            for name, value in phase_s.items():
                self.timings[name].append(value)
            for name in RING_STATS:
                self.timings[name].append(float(getattr(stats, name)))
            for name, counter in RING_BACKWARD_STATS.items():
                self.timings[name].append(float(getattr(backward_stats, counter)))
            self.timings["transfer_only_s"].append(transfer_only)
            self.timings["peak_device_bytes"].append(float(device_memory.peak_bytes()))
            self.timings["useful_flops"].append(self.useful_flops)
        self.rep += 1
        self.elapsed_s += time.perf_counter() - started

    def _agreed_accuracy(self, output: Any) -> dict:
        """This rank's :func:`local_accuracy`, agreed by every rank of the case: an input that cannot be read
        back (changed or damaged during the run) on one rank is raised on all of them, before any rank waits
        in the next collective."""
        from hilbert_hpc.distributed.mpi import collectively

        return collectively(self.comm, local_accuracy, self.case, self.job.seed, self.job.accuracy_rows, output,
                            self.layout, self.rank)

    def results(self) -> tuple[dict, dict[str, list[np.ndarray]], dict]:
        """(per-repeat timings, the last call's host outputs, accuracy sums) once every call has run;
        the inputs are released."""
        self.inputs, self.douts = [], []
        return self.timings, self.outputs, self.accuracy


def derive_metrics(case: Case, timings: dict[str, np.ndarray]) -> dict[str, float]:
    """Medians over repeats of the slowest rank, throughput, ring bandwidth and overlap, load imbalance."""
    att = float(np.median(timings["attention"].max(axis=0)))
    tot = float(np.median(timings["total"].max(axis=0)))
    tokens = case.tokens * case.batch
    flops = useful_flops(case.tokens, case.heads, case.head_dim, case.patterns, case.causal, case.batch)
    metrics = {"tokens_per_s": tokens / tot, "attention_tokens_per_s": tokens / att,
               "useful_tflops": flops / att / 1e12, "useful_flops": float(flops),
               "median_attention_s": att, "median_total_s": tot,
               "ring_gb_per_s": np.nan, "overlap": np.nan, "bytes_sent_per_rank": 0.0,
               "peak_device_bytes": 0.0, "memory_ratio": np.nan,
               "flops_imbalance": imbalance(timings["useful_flops"]),
               "attention_imbalance": imbalance(timings["attention"])}
    metrics.update(backward_metrics(case, timings, flops))
    peak = timings["peak_device_bytes"].max(axis=1)
    if peak.max() > 0:
        # against the floor: this rank's Q, K, V and O (the largest shard)
        floor = 4 * -(-case.tokens // peak.shape[0]) * case.batch * case.heads * case.head_dim \
            * precision(case.dtype).itemsize
        metrics["peak_device_bytes"] = float(peak.max())
        metrics["memory_ratio"] = float(peak.max()) / floor
    sent = timings["bytes_sent"]
    if sent.max() > 0:
        only = timings["transfer_only_s"]
        metrics["bytes_sent_per_rank"] = float(np.median(sent.max(axis=0)))
        # bandwidth of the busiest rank when blocks only travel; overlap: share of that hidden behind compute
        per_rank_bw = np.where(only > 0, sent / np.maximum(only, 1e-30), np.nan)
        metrics["ring_gb_per_s"] = float(np.nanmedian(per_rank_bw[sent.argmax(axis=0), np.arange(sent.shape[1])])) / 1e9
        hidden = 1.0 - np.clip(timings["wait_s"] / np.maximum(only, 1e-30), 0.0, 1.0)
        metrics["overlap"] = float(np.median(hidden.min(axis=0)))
    return metrics


def backward_metrics(case: Case, timings: dict[str, np.ndarray], flops: float) -> dict[str, float]:
    """The backward's medians and throughput (``BACKWARD_FLOPS`` x the forward's useful FLOPs); NaN for a
    forward case."""
    if not backward_pass(case):
        return dict.fromkeys(("median_backward_s", "backward_useful_tflops", "median_forward_backward_s",
                              "forward_backward_useful_tflops", "backward_imbalance"), np.nan)
    bwd = float(np.median(timings["backward"].max(axis=0)))
    both = float(np.median((timings["attention"] + timings["backward"]).max(axis=0)))
    return {"median_backward_s": bwd, "backward_useful_tflops": BACKWARD_FLOPS * flops / bwd / 1e12,
            "median_forward_backward_s": both,
            "forward_backward_useful_tflops": (1 + BACKWARD_FLOPS) * flops / both / 1e12,
            "backward_imbalance": imbalance(timings["backward"])}
