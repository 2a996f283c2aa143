"""Runs the cases of a job on every rank: inputs, timed repeats by phase, ring counters, accuracy, results.

One code path for 1..P ranks. Each rank makes only its own shard of the inputs
(counter-based, a function of the seed and the natural position), runs the
timed repeats, measures its share of the sampled accuracy rows, and sends its
timings (and output rows, when saved) to rank 0, which writes the results file.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, TextIO

import numpy as np

from . import device_memory
from .attention import resolve_ordering
from .backends import get_backend
from .errors import ConfigError, UserError
from .output_files import IO_ERRORS, io_error
from .datafile import read_rows, read_shard
from .inputs import random_rows
from .jobfile import Case, Job
from .patterns import useful_flops
from .precision import precision
from .provenance import provenance
from .reference import reference_rows, sample_selected_rows, selected_heads
from .results import ResultsFile, block_digest, parts_dir, refuse_foreign_parts
from .ring import RingStats, ring_dilated_attention, ring_transfer_only
from .sharding import IndexView, Layout, check_distribution
from .table import SummaryTable

PHASES = ("serialize", "attention", "unserialize", "total")
RING_COUNTERS = ("local_s", "compute_s", "wait_s", "imbalance_s", "pack_s", "transfer_only_s", "bytes_sent")
#: per-repeat measurements besides times: device memory high-water mark (B)
MEMORY = ("peak_device_bytes",)

UNITS = {"tokens_per_s": "1/s", "attention_tokens_per_s": "1/s", "useful_tflops": "TFLOP/s",
         "useful_flops": "FLOP", "median_attention_s": "s", "median_total_s": "s", "ring_gb_per_s": "GB/s",
         "overlap": "1", "bytes_sent_per_rank": "B", "peak_device_bytes": "B", "memory_ratio": "1"}


def case_layout(case: Case, ranks: int) -> Layout:
    """The serialization of ``case`` split over ``ranks`` shards (validates the distribution)."""
    check_distribution(case.tokens, ranks, case.patterns)
    ordering, segment = resolve_ordering(case.ordering, case.patterns, case.segment)
    return Layout(case.grid, ordering, ranks, segment)


def check_case(case: Case, ranks: int | None = None) -> None:
    """Everything that can be refused before any work, identically on every rank (``ranks``: case.ranks)."""
    from .backends import require_usable

    ranks = case.ranks if ranks is None else ranks
    case_layout(case, ranks)
    be = require_usable(case.backend, f"{case.case_id}.backend")
    if ranks > 1 and be.on_gpu and case.transport == "cuda-aware":
        from .cuda_aware import cuda_aware_support

        known, why = cuda_aware_support()
        if not known:
            raise ConfigError(f"transport 'cuda-aware' requested but the MPI library is not known to be CUDA-aware "
                              f"({why}); use staged, or see 'hilbert-hpc cuda-env' "
                              f"(HILBERT_HPC_CUDA_AWARE=1 forces it)", f"{case.case_id}.transport")
    if hasattr(be, "check_case"):
        try:
            be.check_case(case.head_dim, case.dtype, ranks)
        except (RuntimeError, ValueError) as exc:
            raise ConfigError(str(exc), f"{case.case_id}.dtype") from None
    if ranks > 1 and be.attend_fn is None:
        raise ConfigError(f"backend {case.backend!r} is the single-process baseline; run it with one rank "
                          f"or choose numpy/cupy", f"{case.case_id}.backend")


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


def backend_inputs(case: Case, seed: int, layout: Layout, comm: Any, batch_index: int, be: Any) -> list[Any]:
    """This rank's Q, K, V shard as the backend computes with them (its arrays, the case's dtype).

    16-bit random inputs are made a chunk of rows at a time, each chunk rounded as
    it reaches the backend, so their float32 values never exist whole on the device
    (a 16-bit sequence can then be twice as long as a float32 one). Other inputs
    are made as ``shard_inputs`` makes them; the backend's ``to_device`` is then a
    no-op in the timed calls.
    """
    from .arrays import concatenate
    from .inputs import CHUNK_ELEMENTS

    xp = generation_module(be.on_gpu)
    if case.input or not precision(case.dtype).sixteen_bit:
        return shard_inputs(case, seed, layout, comm, batch_index, xp)
    positions = batch_index * case.tokens + layout.shard_natural(comm.Get_rank())
    step = max(1, CHUNK_ELEMENTS // (case.heads * case.head_dim))
    return [concatenate([be.to_device(random_rows(seed, t, positions[i:i + step], case.heads, case.head_dim,
                                                  np.float32, xp), case.dtype)
                         for i in range(0, len(positions), step)]) for t in ("q", "k", "v")]


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
    result = {"rows": int(serial.size), "selected_pairs": int(selected_heads(serial, case.heads, case.patterns).sum()),
              "max_abs": 0.0, "max_ref": 0.0, "sq_err": 0.0, "sq_ref": 0.0}
    if not serial.size:
        return result
    picked = layout.natural_of(serial)

    prec = precision(case.dtype)

    def source(name: str, idx: np.ndarray) -> np.ndarray:
        """The rows as the backend sees them: made or read, rounded to the case's dtype, in float64."""
        if case.input:
            return prec.round(read_rows(case.input, name, 0, idx, np.float64))
        return prec.round(random_rows(seed, name, idx, case.heads, case.head_dim, prec.generation_dtype()))

    ref = reference_rows(picked, source=source, perm=IndexView(layout.natural_of),
                         inverse=IndexView(layout.serialized_of), heads=case.heads, patterns=case.patterns,
                         causal=case.causal, scale=case.softmax_scale)
    got = np.asarray(output[serial - rank * layout.shard], dtype=np.float64)
    diff = got - ref
    result.update(max_abs=float(np.abs(diff).max()), max_ref=float(np.abs(ref).max()),
                  sq_err=float((diff ** 2).sum()), sq_ref=float((ref ** 2).sum()))
    return result


def combine_accuracy(parts: list[dict]) -> dict[str, float]:
    """Global accuracy from every rank's error sums (and counts of NaN/Inf outputs).

    ``rows`` and ``selected_pairs`` say what the error figures rest on: the
    sampled rows, and their (row, head) pairs that some pattern selects.
    """
    rows = sum(p["rows"] for p in parts)
    pairs = sum(p.get("selected_pairs", 0) for p in parts)
    nonfinite = sum(p.get("nonfinite", 0) for p in parts)
    if rows == 0:
        return {"rows": 0, "selected_pairs": 0, "nonfinite": nonfinite, "max_abs_err": np.nan,
                "max_rel_err": np.nan, "rel_l2_err": np.nan}
    tiny = np.finfo(np.float64).tiny
    max_abs = max(p["max_abs"] for p in parts)
    max_ref = max(p["max_ref"] for p in parts)
    l2_ref = np.sqrt(sum(p["sq_ref"] for p in parts))
    return {"rows": rows, "selected_pairs": pairs, "nonfinite": nonfinite, "max_abs_err": max_abs,
            "max_rel_err": max_abs / max(max_ref, tiny),
            "rel_l2_err": float(np.sqrt(sum(p["sq_err"] for p in parts)) / max(l2_ref, tiny))}


class CaseRun:
    """One case on this rank: the backend, the shard, the transport, and the timed repeats."""

    def __init__(self, case: Case, job: Job, comm: Any) -> None:
        from .transports import resolve_transport

        self.case, self.job, self.comm = case, job, comm
        self.rank, self.ranks = comm.Get_rank(), comm.Get_size()
        self.be = get_backend(case.backend)
        self.layout = case_layout(case, self.ranks)
        self.transport, self.transport_reason = (None, "single rank: no communication")
        if self.ranks > 1:
            self.transport, self.transport_reason = resolve_transport(case.transport, self.be.on_gpu, comm)
        #: fused kernels of the ring for this dtype, and the arrays the ring moves (16 bits: int16 views)
        ring_kernels = getattr(self.be, "ring_kernels", None)
        self.ring_kernels = ring_kernels(case.dtype) if ring_kernels else getattr(self.be, "kernels", None)
        self.ring_view = getattr(self.be, "ring_view", lambda x: x)
        self.ring_output = getattr(self.be, "ring_output", lambda out, dtype: out)
        #: calls made so far, and the seconds this case's own work took (inputs and calls)
        self.rep, self.elapsed_s = 0, 0.0

    def attention(self, qs: Any, ks: Any, vs: Any, stats: RingStats) -> Any:
        """Dilated attention of this rank's shard (the whole sequence on one rank)."""
        c = self.case
        if self.ranks == 1:
            return self.be.serialized_attention(qs, ks, vs, c.patterns, c.causal, c.softmax_scale)
        out = ring_dilated_attention(qs, ks, vs, patterns=c.patterns, comm=self.comm, causal=c.causal,
                                     scale=c.softmax_scale, transport=self.transport,
                                     attend_fn=self.be.attend_fn, stats=stats, sync_rings=True,
                                     kernels=self.ring_kernels)
        return self.ring_output(out, c.dtype)

    def run(self) -> tuple[dict, list[np.ndarray], dict]:
        """Warm-up and timed repeats; returns (per-repeat timings, host outputs, accuracy sums).

        The accuracy check comes first: the output of the first call (a warm-up
        when there is one) is compared with float64 on the sampled rows, and all
        of it is checked for NaN/Inf, before the timed repeats run. Outputs stay
        where the backend made them: only the sampled rows come to the host, and
        the whole output only when the job saves it (then every repeat copies it,
        timed as ``unserialize``; the host outputs returned are the last repeat's).
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
        self.inputs = [backend_inputs(c, self.job.seed, self.layout, self.comm, b, self.be) for b in range(c.batch)]
        device_memory.reset_peak()
        self.timings: dict[str, list[float]] = {name: [] for name in PHASES + RING_COUNTERS + MEMORY}
        self.outputs: list[np.ndarray] = []
        self.accuracy: dict = {}
        self.rep = 0
        self.elapsed_s = time.perf_counter() - t0
        return self

    def step(self) -> None:
        """The next call (warm-up or timed repeat) on every batch element; the first one also checks accuracy."""
        from .arrays import RowReader, count_nonfinite

        started = time.perf_counter()
        c, job, be, rep = self.case, self.job, self.be, self.rep
        phase_s = dict.fromkeys(PHASES, 0.0)
        stats = RingStats()
        transfer_only = 0.0
        self.outputs = []
        nonfinite = 0
        self.comm.Barrier()
        for b, (q, k, v) in enumerate(self.inputs):
            t0 = time.perf_counter()
            qs, ks, vs = (be.to_device(x, c.dtype) for x in (q, k, v))
            if self.ranks > 1:
                qs, ks, vs = (self.ring_view(x) for x in (qs, ks, vs))
            be.synchronize()
            t1 = time.perf_counter()
            out_s = self.attention(qs, ks, vs, stats)
            be.synchronize()
            t2 = time.perf_counter()
            if job.save_output:
                self.outputs.append(be.to_numpy(out_s))
            t3 = time.perf_counter()
            phase_s["serialize"] += t1 - t0
            phase_s["attention"] += t2 - t1
            phase_s["unserialize"] += t3 - t2
            phase_s["total"] += t3 - t0
            if rep == 0:
                # checked before anything is timed: the first call's output against float64, all of it finite
                nonfinite += count_nonfinite(out_s)
                if b == 0:
                    self.accuracy = self._agreed_accuracy(RowReader(out_s))
            del out_s                      # before the next call allocates its output
            if self.ranks > 1:
                self.comm.Barrier()
                transfer_only += ring_transfer_only(ks, vs, patterns=c.patterns, comm=self.comm,
                                                    causal=c.causal, transport=self.transport).wait_s
        if rep == 0:
            self.accuracy["nonfinite"] = nonfinite
        if rep >= job.warmup:
            for name, value in phase_s.items():
                self.timings[name].append(value)
            for name in ("local_s", "compute_s", "wait_s", "imbalance_s", "pack_s", "bytes_sent"):
                self.timings[name].append(float(getattr(stats, name)))
            self.timings["transfer_only_s"].append(transfer_only)
            self.timings["peak_device_bytes"].append(float(device_memory.peak_bytes()))
        self.rep += 1
        self.elapsed_s += time.perf_counter() - started

    def _agreed_accuracy(self, output: Any) -> dict:
        """This rank's :func:`local_accuracy`, agreed by every rank of the case: an input that cannot be read
        back (changed or damaged during the run) on one rank is raised on all of them, before any rank waits
        in the next collective."""
        from .mpi import agree

        accuracy, error = {}, None
        try:
            accuracy = local_accuracy(self.case, self.job.seed, self.job.accuracy_rows, output, self.layout,
                                      self.rank)
        except UserError as exc:
            error = exc
        error = agree(self.comm, error)
        if error is not None:
            raise error
        return accuracy

    def results(self) -> tuple[dict, list[np.ndarray], dict]:
        """(per-repeat timings, the last call's host outputs, accuracy sums) once every call has run;
        the inputs are released."""
        self.inputs = []
        return self.timings, self.outputs, self.accuracy


def derive_metrics(case: Case, timings: dict[str, np.ndarray]) -> dict[str, float]:
    """Medians over repeats of the slowest rank, throughput, ring bandwidth and overlap."""
    att = float(np.median(timings["attention"].max(axis=0)))
    tot = float(np.median(timings["total"].max(axis=0)))
    tokens = case.tokens * case.batch
    flops = useful_flops(case.tokens, case.heads, case.head_dim, case.patterns, case.causal, case.batch)
    metrics = {"tokens_per_s": tokens / tot, "attention_tokens_per_s": tokens / att,
               "useful_tflops": flops / att / 1e12, "useful_flops": float(flops),
               "median_attention_s": att, "median_total_s": tot,
               "ring_gb_per_s": np.nan, "overlap": np.nan, "bytes_sent_per_rank": 0.0,
               "peak_device_bytes": 0.0, "memory_ratio": np.nan}
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


def parallel_hdf5(comm: Any) -> bool:
    """True when the case's ranks can write one shared file through parallel HDF5 (h5py built with MPI).

    ``HILBERT_HPC_PARALLEL_HDF5=0`` forces the per-rank files (e.g. on a file
    system where MPI-IO is slow or broken); a single rank never needs it.
    """
    if os.environ.get("HILBERT_HPC_PARALLEL_HDF5", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if comm.Get_size() < 2 or type(comm).__module__.split(".")[0] != "mpi4py":
        return False
    import h5py

    return bool(h5py.get_config().mpi)


def write_output_part(case: Case, comm: Any, layout: Layout, outputs: list[np.ndarray], results_path: Path,
                      results_id: str) -> tuple[str, str]:
    """Every rank of the case writes its block of the output, in natural order; no rank holds more than its shard.

    Rank ``r`` receives the natural positions ``[r*L, (r+1)*L)`` by one all-to-all
    exchange. With parallel HDF5 all ranks write their blocks into one file,
    ``<results>.parts/<case-id>/output.h5`` (collective MPI-IO); otherwise each
    rank writes ``<results>.parts/<case-id>/rank<r>.h5``. The parts folder must
    belong to the results file ``results_id`` (rank 0 made it, holding the file's
    lock); each part records that identity, the case and the SHA-256 of the
    block(s) it holds. Returns this rank's file, relative to the results file, and
    the SHA-256 of its block.
    """
    import h5py

    from .datafile import redistribute

    rank = comm.Get_rank()
    natural = layout.shard_natural(rank)
    file_dtype = precision(case.dtype).file_dtype       # HDF5 has no bfloat16: stored exactly as float32
    blocks = np.stack([redistribute(np.asarray(o, dtype=file_dtype), natural, layout.shard, comm) for o in outputs])
    digest = block_digest(blocks)
    digests = comm.allgather(digest)
    shared = parallel_hdf5(comm)
    parts = parts_dir(results_path)
    refuse_foreign_parts(parts, results_path, results_id)
    rel = Path(parts.name) / case.case_id / ("output.h5" if shared else f"rank{rank:05d}.h5")
    target = results_path.parent / rel
    target.parent.mkdir(exist_ok=True)
    if shared:
        comm.Barrier()                                   # the folder exists before any rank opens the file
        shape = (blocks.shape[0], layout.shard * comm.Get_size(), *blocks.shape[2:])
        with h5py.File(target, "w", driver="mpio", comm=comm) as f:
            ds = f.create_dataset("output", shape=shape, dtype=blocks.dtype)
            with ds.collective:
                ds[:, rank * layout.shard:(rank + 1) * layout.shard] = blocks
            ds.attrs["first_token"] = 0
            _output_attrs(ds, case, results_id, digests)
    else:
        with h5py.File(target, "w") as f:
            ds = f.create_dataset("output", data=blocks)
            ds.attrs["first_token"] = rank * layout.shard
            _output_attrs(ds, case, results_id, [digest])
    return str(rel), digest


def _output_attrs(ds: Any, case: Case, results_id: str, digests: list[str]) -> None:
    """What a part says about itself: layout, owner (results file and case), SHA-256 of its rank block(s)."""
    ds.attrs["order"] = "natural"
    ds.attrs["axes"] = "batch, token, head, dim"
    ds.attrs["results_id"] = results_id
    ds.attrs["case_id"] = case.case_id
    ds.attrs["sha256"] = json.dumps(digests)


def run_case(case: Case, job: Job, comm: Any, results: ResultsFile | None,
             table: SummaryTable | None, results_path: Path | None = None, results_id: str = "",
             measured: CaseRun | None = None) -> dict | None:
    """Run one case on every rank of ``comm``; rank 0 writes it and prints its row. Returns the record on rank 0.

    ``results_id`` is the identity of the results file (every rank), which its
    output parts carry. ``measured``: the case's CaseRun whose calls have all run
    already (interleaved repeats); it is only gathered and written. A failed
    write of an output part (any rank) or of the results file (rank 0) raises a
    UserError on the ranks that saw it; the case stays incomplete. The caller
    agrees on it with every rank at the next case boundary.
    """
    from .mpi import agree

    run = measured or CaseRun(case, job, comm)
    t0 = time.perf_counter() - run.elapsed_s           # wall_s: this case's own work, not other cases'
    timings, outputs, accuracy = run.results() if measured else run.run()
    all_timings = comm.gather(timings, root=0)
    all_accuracy = comm.gather(accuracy, root=0)
    parts = digests = None
    if job.save_output:
        path = Path(results_path or job.output)
        error = None
        if results is not None:
            try:
                results.begin()                          # the first case of a replacing run: the old file goes now
            except UserError as exc:
                error = exc
        error = agree(comm, error)                       # the parts folder is ready before any rank writes
        if error is not None:
            raise error
        try:
            rel, digest = write_output_part(case, comm, run.layout, outputs, path, results_id)
        except UserError as exc:
            error = exc
        except IO_ERRORS as exc:
            error = io_error(exc, "write an output part of", path,
                             "its complete cases are kept; free some space and continue with --resume")
        error = agree(comm, error)                       # every part is on disk before the case is committed
        if error is not None:
            raise error
        gathered = comm.gather((rel, digest), root=0)
        if gathered is not None:
            parts, digests = [g[0] for g in gathered], [g[1] for g in gathered]
    if run.rank != 0:
        return None
    stacked = {name: np.asarray([t[name] for t in all_timings], dtype=np.float64) for name in timings}
    accuracy = combine_accuracy(all_accuracy)
    tol = precision(case.dtype).tolerance
    accuracy.update(tolerance=tol, within_tolerance=bool(
        accuracy["nonfinite"] == 0 and (not accuracy["rows"] or accuracy["max_rel_err"] <= tol)))
    if accuracy["nonfinite"]:
        print(f"hilbert-hpc: warning: case {case.case_id}: the output holds {accuracy['nonfinite']:,} NaN or "
              f"infinite value(s)", file=sys.stderr, flush=True)
    elif not accuracy["within_tolerance"]:
        print(f"hilbert-hpc: warning: case {case.case_id}: max relative error {accuracy['max_rel_err']:.2e} against "
              f"float64 exceeds the {case.dtype} tolerance {tol:g}", file=sys.stderr, flush=True)
    record = {
        "timings": stacked,
        "metrics": derive_metrics(case, stacked),
        "units": UNITS,
        "accuracy": accuracy,
        "attrs": {"ranks": run.ranks, "transport": "none" if run.transport is None else run.transport.name,
                  "kernel": run.be.kernel_variant(case.head_dim, case.dtype) if hasattr(run.be, "kernel_variant")
                  else "none",
                  "transport_reason": run.transport_reason, "wall_s": time.perf_counter() - t0},
    }
    results.write_case(case, record, parts, (case.batch, case.tokens, case.heads, case.head_dim), run.layout.shard,
                       digests)
    table.row(case, record)
    return record


class SubComms:
    """One communicator per rank count of a job: the first ``p`` ranks of ``comm`` (collective)."""

    def __init__(self, comm: Any, sizes: set[int]) -> None:
        self.comm = comm
        self.subs: dict[int, Any] = {}
        rank = comm.Get_rank()
        for p in sorted(sizes):
            if p == comm.Get_size():
                self.subs[p] = comm
                continue
            from mpi4py import MPI

            sub = comm.Split(0 if rank < p else MPI.UNDEFINED, rank)
            self.subs[p] = None if sub == MPI.COMM_NULL else sub

    def get(self, ranks: int) -> Any:
        """The communicator of a case on ``ranks`` ranks, or None on the ranks that sit it out."""
        return self.subs[ranks]

    def free(self) -> None:
        """Release the split communicators."""
        for p, sub in self.subs.items():
            if sub is not None and sub is not self.comm:
                sub.Free()
        self.subs = {}


class CaseLoop:
    """The boundaries of a run's case loop, agreed by every rank of the run: stop requests, errors, progress.

    Every rank of ``comm`` calls :meth:`boundary` / :meth:`errors` the same
    number of times (ranks that sit a case out too), so a stop or any rank's
    error ends every rank at the same point.
    """

    def __init__(self, comm: Any, stops: Any, todo: list[Case], complete: int, total: int, path: Path,
                 results_id: str, tracker: Any, results: ResultsFile | None = None) -> None:
        self.comm, self.stops, self.path, self.tracker = comm, stops, path, tracker
        self.results = results                         # rank 0's open results file (None on other ranks)
        self.results_id = results_id                   # what the run's output parts carry
        self.index = {c.case_id: i for i, c in enumerate(todo)}
        self.complete, self.total = complete, total
        self.failed: UserError | None = None
        self.rank0 = comm.Get_rank() == 0

    def boundary(self, where: str = "at a case boundary", dropped: str = "") -> None:
        """Raise any rank's error, or StoppedForRequeue when any rank was asked to stop (``dropped``: what is lost)."""
        import signal

        from .signals import StoppedForRequeue

        stop, self.failed = self.stops.agreed(self.comm, self.failed)
        self.errors(agreed=True)
        if stop:
            if self.replacing():
                raise StoppedForRequeue(f"stopped by {signal.Signals(stop).name} {where}, before the first case "
                                        f"was committed: the old {self.path} is unchanged; run again with "
                                        f"--overwrite to replace it", "run")
            raise StoppedForRequeue(f"stopped by {signal.Signals(stop).name} {where}: {self.complete} of "
                                    f"{self.total} cases are complete in {self.path}{dropped}; continue with "
                                    f"'run --resume'", "run")

    def replacing(self) -> bool:
        """True on rank 0 while an ``--overwrite`` run has not yet replaced the old file (nothing committed)."""
        return self.results is not None and not self.results.started

    def errors(self, agreed: bool = False) -> None:
        """Raise any rank's error on every rank; a stop request waits for the next :meth:`boundary`."""
        if not agreed:
            _, self.failed = self.stops.agreed(self.comm, self.failed)
        if self.failed is not None:
            raise self.failed

    def attempt(self, work: Callable[[], Any]) -> None:
        """Run ``work`` on this rank; a UserError is kept for the next boundary (where every rank raises it)."""
        try:
            work()
        except UserError as exc:
            self.failed = exc

    def status(self) -> str:
        """What is kept so far and how to go on, e.g. "2 of 4 cases are complete in r.h5; continue with 'run
        --resume'" (said when the launcher ends the run)."""
        if self.replacing():
            return f"nothing was committed: the old {self.path} is unchanged; run again with --overwrite to replace it"
        return f"{self.complete} of {self.total} cases are complete in {self.path}; continue with 'run --resume'"

    def finished(self, case: Case) -> None:
        """Count ``case`` complete (unless this rank failed it) and print the progress line."""
        if self.failed is None:
            self.tracker.advance(self.index[case.case_id], f"{case.case_id} on {case.ranks} rank(s)")
            self.complete += 1


def run_in_turn(job: Job, loop: CaseLoop, subs: "SubComms", results: ResultsFile | None,
                table: SummaryTable | None, stream: TextIO, done: set[str]) -> None:
    """Every case not yet complete, one after another, each with all of its repeats (the default)."""
    for case in job.cases:
        if case.case_id in done:
            if loop.rank0:
                print(f"{case.case_id}  complete in {loop.path}, skipped", file=stream, flush=True)
            continue
        loop.boundary()
        sub = subs.get(case.ranks)
        if sub is not None:
            loop.attempt(lambda: run_case(case, job, sub, results, table, loop.path, loop.results_id))
        loop.finished(case)
    loop.errors()


def interleave_groups(cases: list[Case]) -> list[list[Case]]:
    """Cases grouped by rank count (groups in the order of their first case), job order inside a group."""
    groups: dict[int, list[Case]] = {}
    for case in cases:
        groups.setdefault(case.ranks, []).append(case)
    return list(groups.values())


def interleave_notes(job: Job, todo: list[Case]) -> list[str]:
    """With ``interleave``: one note per group of more than one case, with the input memory it holds at once."""
    if not job.interleave:
        return []
    notes = []
    for group in interleave_groups(todo):
        if len(group) < 2:
            continue
        ranks = group[0].ranks
        held = sum(3 * c.batch * (c.tokens // ranks) * c.heads * c.head_dim * precision(c.dtype).itemsize
                   for c in group)
        notes.append(f"interleave: the {len(group)} cases on {ranks} rank(s) ({group[0].case_id} ... "
                     f"{group[-1].case_id}) run their repeats in turn; their inputs stay in memory together, "
                     f"{held / (1 << 30):.3g} GiB per rank")
    return notes


def run_interleaved(job: Job, loop: CaseLoop, subs: "SubComms", results: ResultsFile | None,
                    table: SummaryTable | None, stream: TextIO, done: set[str]) -> None:
    """Cases grouped by rank count; in a group, call ``r`` (warm-ups first) of every case runs before call ``r+1``.

    Clock drift then falls on every case of a group alike. Each case's inputs
    are made before the first call and kept until the group's calls are done;
    each first call is checked for accuracy as without interleaving. The cases
    are then written in job order. A stop between calls drops the group's
    cases (none is written); one while they are written waits for the group.
    """
    if loop.rank0:
        for case in job.cases:
            if case.case_id in done:
                print(f"{case.case_id}  complete in {loop.path}, skipped", file=stream, flush=True)
    for group in interleave_groups([c for c in job.cases if c.case_id not in done]):
        loop.boundary()
        sub = subs.get(group[0].ranks)
        runs: list[CaseRun] = []
        if sub is not None:
            loop.attempt(lambda: runs.extend(CaseRun(c, job, sub).start() for c in group))
        for _ in range(job.warmup + job.repeats):
            loop.boundary("between interleaved repeats", f" (the {len(group)} case(s) of the group on "
                          f"{group[0].ranks} rank(s) run again)")
            if sub is not None:
                loop.attempt(lambda: [run.step() for run in runs])
        measured = {run.case.case_id: run for run in runs}
        for case in group:
            loop.errors()
            if sub is not None:
                loop.attempt(lambda: run_case(case, job, sub, results, table, loop.path, loop.results_id,
                                              measured=measured.pop(case.case_id)))
            loop.finished(case)
        del runs, measured
    loop.errors()


def run_job(job: Job, output: str | None = None, stream: TextIO | None = None, comm: Any = None,
            resume: bool = False, progress: TextIO | None = None, overwrite: bool = False) -> Path:
    """Run every case of ``job`` on the ranks of ``comm`` it asks for; rank 0 writes the file and prints the table.

    A case on ``p`` ranks runs on the first ``p`` ranks (a sub-communicator), so
    one allocation runs a whole scaling curve. Rank 0 owns the results file for
    the whole run (``ResultsFile.open``: refusals, lock, temporary name): an
    existing file is continued with ``resume`` (complete, sound cases of the
    same job are skipped) or replaced with ``overwrite``, else refused.
    SIGUSR1/SIGTERM/SIGINT stop the job at the next case boundary (all ranks
    agree) with the file flushed: ``StoppedForRequeue``. An I/O error on any rank
    is agreed at the boundary too, so every rank ends with the same one line.
    """
    from .jobfile import accuracy_rows_notes
    from .mpi import agree
    from .mpi import bind_gpu, world
    from .plan import check_job_fits
    from .progress import Progress
    from .signals import StopRequests

    comm = comm or world()
    stream = stream or sys.stdout               # looked up now: the caller's stdout, not the one at import
    for case in job.cases:
        check_case(case)
        if case.ranks > comm.Get_size():
            raise ConfigError(f"needs {case.ranks} ranks, this run has {comm.Get_size()}", f"{case.case_id}.ranks")
    if any(get_backend(c.backend).on_gpu for c in job.cases):
        bind_gpu(comm)
    check_job_fits(job, comm)
    path = Path(output or job.output)
    rank0 = comm.Get_rank() == 0
    prov = provenance(comm)
    results, error = None, None
    if rank0:
        try:
            results = ResultsFile.open(path, job, prov, resume=resume, overwrite=overwrite)
        except UserError as exc:
            error = exc
    error = agree(comm, error)                 # only rank 0 can fail here, and then it holds no file
    if error is not None:
        raise error
    kept, results_id = comm.bcast((results.kept, results.results_id) if rank0 else None, root=0)
    done = set(kept)
    todo = [c for c in job.cases if c.case_id not in done]
    table = SummaryTable(stream) if rank0 else None
    tracker = Progress([useful_flops(c.tokens, c.heads, c.head_dim, c.patterns, c.causal, c.batch) for c in todo],
                       (progress or sys.stderr) if rank0 else None)
    subs = SubComms(comm, {c.ranks for c in todo})
    try:
        loop = CaseLoop(comm, None, todo, len(job.cases) - len(todo), len(job.cases), path, results_id, tracker,
                        results)
        with StopRequests(loop.status) as stops:
            loop.stops = stops
            if rank0:
                print(f"hilbert-hpc: job {job.name!r}, {len(job.cases)} case(s) on up to {comm.Get_size()} "
                      f"rank(s), results -> {path}", file=stream)
                for note in results.notes + accuracy_rows_notes(job) + interleave_notes(job, todo):
                    print(f"hilbert-hpc: note: {note}", file=sys.stderr, flush=True)
                table.header()
            run_cases = run_interleaved if job.interleave else run_in_turn
            run_cases(job, loop, subs, results, table, stream, done)
    finally:
        subs.free()
        if results is not None:
            results.close(quiet=sys.exc_info()[0] is not None)
    return path
