"""The results record: the one definition of what a case writes to the results file (docs/results.md).

Each group of the record is a dataclass, and each of its fields says its unit
and its meaning (:func:`entry`). The writer (``runner``, ``results``) fills and
stores them by these fields, ``report`` reads them back by these fields, and
``tests/test_record.py`` checks the table in docs/results.md against them; so a
new field is one line here (and its line in the docs).

Where each group goes in a case group ``/cases/<case-id>/`` (:data:`GROUPS`):
``Parameters``, ``Setup`` and ``Bookkeeping`` are attributes of the case group,
``Timings`` one dataset per field under ``timings/``, ``Metrics`` and
``Accuracy`` attributes of the groups ``metrics`` and ``accuracy``, ``Output``
attributes of the ``output`` dataset.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator

import numpy as np


def entry(unit: str, meaning: str, default: Any = dataclasses.MISSING, kind: str = "", column: str = "",
          key: str = "") -> Any:
    """A field of the record: its ``unit`` ("-" for text and flags, "1" for plain numbers), a one-line
    ``meaning``, an optional ``default``, a ``kind`` (timings: phase, ring, ring_backward, transfer, memory, work), the
    ``column`` of report's cases table (and CSV) that shows it, if any, and its ``key`` in the file when that
    differs from the field's name (a Python keyword: ``pass``)."""
    return dataclasses.field(default=default, metadata={"unit": unit, "meaning": meaning, "kind": kind,
                                                        "column": column, "key": key})


def key(f: dataclasses.Field) -> str:
    """The name of a record field in the file (and in ``params_json``)."""
    return f.metadata["key"] or f.name


@dataclass(frozen=True)
class Parameters:
    """The case's parameters as the job resolved them (``Case.params()``): what a resume matches on."""

    PLACE: ClassVar[str] = "case attrs"

    name: str = entry("-", "the name of the job's case entry")
    tokens: int = entry("1", "sequence length N (the product of grid)")
    grid: list[int] = entry("1", "token grid the sequence is ordered on")
    patterns: list[list[int]] = entry("1", "dilation patterns as [segment, dilation] pairs")
    batch: int = entry("1", "batch elements")
    heads: int = entry("1", "attention heads")
    head_dim: int = entry("1", "dimension of each head")
    causal: bool = entry("-", "causal mask on the serialized order")
    ordering: str = entry("-", "token ordering (natural, hilbert, ...)")
    segment: int = entry("1", "segment of a segmented ordering (0: none)")
    dtype: str = entry("-", "dtype the case computes in")
    backend: str = entry("-", "backend that computes the attention")
    scale: float = entry("1", "softmax scale applied to Q K^T")
    transport: str = entry("-", "transport requested (auto, host, staged, cuda-aware, ...)")
    input: str = entry("-", "input data file (empty: random inputs from the seed)")
    ranks: int = entry("1", "ranks the case runs on")
    scaling: str = entry("-", "scaling series the case belongs to (strong or weak)")
    pass_: str = entry("-", "forward, or forward+backward (files without it: forward)", key="pass")
    placement: str = entry("-", "placement requested: auto, contiguous or zigzag (files without it: auto)")
    long_schedule: str = entry("-", "long-pattern schedule requested: auto, gather or ring (files without it: auto)")

    @classmethod
    def of(cls, case: Any) -> "Parameters":
        """The parameters of a resolved ``jobfile.Case``."""
        return cls(name=case.name, tokens=case.tokens, grid=list(case.grid),
                   patterns=[[p.segment, p.dilation] for p in case.patterns], batch=case.batch, heads=case.heads,
                   head_dim=case.head_dim, causal=case.causal, ordering=case.ordering, segment=case.segment or 0,
                   dtype=case.dtype, backend=case.backend, scale=case.softmax_scale, transport=case.transport,
                   input=case.input or "", ranks=case.ranks, scaling=case.scaling, pass_=case.pass_,
                   placement=case.placement, long_schedule=case.long_schedule)


@dataclass(frozen=True)
class Setup:
    """How the case ran: what was decided for it on this run."""

    PLACE: ClassVar[str] = "case attrs"

    ranks: int = entry("1", "ranks the case ran on")
    transport: str = entry("-", "transport used (none on one rank)")
    kernel: str = entry("-", "GPU kernel variant (cuda-fp32 and cuda: wgmma_ws, wgmma, tf32x3, tiled128, tiled64 or warp; "
                             "cuda 16-bit: wgmma16, tma16 or mma16; else none)")
    backward_kernel: str = entry("-", "GPU backward kernel of a forward+backward case (cuda-fp32 and cuda: tf32x3_bwd "
                                      "or fma_bwd; cuda 16-bit: wgmma16_bwd, mma16_bwd or fma_bwd; else none)")
    transport_reason: str = entry("-", "why that transport was used")
    placement: str = entry("-", "serialized positions per rank: contiguous, or zigzag (chunks p and 2P-1-p of 2P; "
                                "files without it: contiguous)")
    long_schedules: str = entry("-", "schedule of each long pattern, '(w, r) over g ranks: gather' or ': ring', "
                                     "joined by '; ' (empty: none; files without it: ring)")
    wall_s: float = entry("s", "wall time of the case's own work on rank 0 (inputs, calls, writing its output)")


@dataclass(frozen=True)
class Bookkeeping:
    """What the results file records about the case itself."""

    PLACE: ClassVar[str] = "case attrs"

    params_json: str = entry("-", "the parameters as canonical JSON (sorted keys): what a resume matches on")
    input_sha256: str = entry("-", "SHA-256 of the input file's bytes (only cases with an input file)")
    version: str = entry("-", "version of hilbert_hpc that computed the case (files without it: the root's "
                              "version)", column="version")
    git_hash: str = entry("-", "commit of the code that computed the case, -dirty when it had changes (files "
                               "without it: the root's git_hash)", column="git_hash")
    finished_utc: str = entry("-", "when the case was written (ISO 8601, UTC)")
    complete: bool = entry("-", "true once the case is written whole")


@dataclass(frozen=True)
class Timings:
    """Per rank and repeat (float64, shape (ranks, repeats)); attrs ``units`` and ``axes``."""

    PLACE: ClassVar[str] = "timings/<name>"

    serialize: np.ndarray = entry("s", "copy of Q, K, V to the device (and ring views)", kind="phase")
    attention: np.ndarray = entry("s", "the attention call (the forward)", kind="phase")
    backward: np.ndarray = entry("s", "the backward call (pass = forward+backward; 0 otherwise)", kind="phase")
    unserialize: np.ndarray = entry("s", "copy of the output (and gradients) to the host (only when outputs are saved)",
                                    kind="phase")
    total: np.ndarray = entry("s", "serialize + attention + backward + unserialize", kind="phase")
    local_s: np.ndarray = entry("s", "ring: attention of the rank's own block", kind="ring")
    compute_s: np.ndarray = entry("s", "ring: attention of the blocks received", kind="ring")
    wait_s: np.ndarray = entry("s", "ring: waiting for blocks to arrive", kind="ring")
    pack_s: np.ndarray = entry("s", "ring: packing blocks to send", kind="ring")
    imbalance_s: np.ndarray = entry("s", "ring: waiting at the closing barrier for slower ranks", kind="ring")
    transfer_only_s: np.ndarray = entry("s", "the ring's exchanges alone, without compute", kind="transfer")
    bytes_sent: np.ndarray = entry("B", "bytes the rank sent in the ring", kind="ring")
    ring_steps: np.ndarray = entry("1", "ring: hops the rank made around rotating rings (a gathered pattern makes "
                                        "none; files without it: no count)", kind="ring")
    messages: np.ndarray = entry("1", "ring: messages the rank sent (blocks of rotating rings, gathered blocks; "
                                      "files without it: no count)", kind="ring")
    backward_local_s: np.ndarray = entry("s", "ring backward: gradients of the rank's own block (0 on one rank and "
                                              "for pass = forward)", kind="ring_backward")
    backward_compute_s: np.ndarray = entry("s", "ring backward: gradients of the blocks received",
                                           kind="ring_backward")
    backward_wait_s: np.ndarray = entry("s", "ring backward: waiting for blocks (and the gradients coming home)",
                                        kind="ring_backward")
    backward_pack_s: np.ndarray = entry("s", "ring backward: packing blocks to send", kind="ring_backward")
    backward_imbalance_s: np.ndarray = entry("s", "ring backward: waiting at the barrier before each ring for "
                                                  "slower ranks", kind="ring_backward")
    backward_bytes_sent: np.ndarray = entry("B", "bytes the rank sent in the ring backward (blocks and their "
                                                 "gradients)", kind="ring_backward")
    backward_ring_steps: np.ndarray = entry("1", "ring backward: hops around rotating rings (files without it: no "
                                                 "count)", kind="ring_backward")
    backward_messages: np.ndarray = entry("1", "ring backward: messages the rank sent (blocks, gradient terms; "
                                               "files without it: no count)", kind="ring_backward")
    peak_device_bytes: np.ndarray = entry("B", "GPU allocator high-water mark (0 on CPUs)", kind="memory")
    useful_flops: np.ndarray = entry("FLOP", "useful FLOPs of the forward over the queries the rank owns "
                                             "(core.work.rank_useful_flops; the backward's: 2.5 x), every repeat",
                                     kind="work")


@dataclass(frozen=True)
class Metrics:
    """Medians over repeats of the slowest rank (attrs of ``metrics``, with their units as JSON in ``units``)."""

    PLACE: ClassVar[str] = "metrics attrs"

    tokens_per_s: float = entry("1/s", "tokens * batch / median total time")
    attention_tokens_per_s: float = entry("1/s", "tokens * batch / median attention time")
    useful_tflops: float = entry("TFLOP/s", "useful FLOPs / median attention time")
    useful_flops: float = entry("FLOP", "4 D per attended (query, key) pair (core.patterns.useful_flops)")
    median_attention_s: float = entry("s", "median attention time")
    median_total_s: float = entry("s", "median total time")
    ring_gb_per_s: float = entry("GB/s", "ring bandwidth of the busiest rank when blocks only travel")
    overlap: float = entry("1", "share of the ring's transfer time hidden behind compute")
    bytes_sent_per_rank: float = entry("B", "bytes the busiest rank sent per call")
    peak_device_bytes: float = entry("B", "GPU allocator high-water mark of the busiest rank")
    memory_ratio: float = entry("1", "peak / this rank's Q, K, V, O bytes")
    median_backward_s: float = entry("s", "median backward time (NaN for pass = forward)")
    backward_useful_tflops: float = entry("TFLOP/s", "2.5 x useful FLOPs / median backward time")
    median_forward_backward_s: float = entry("s", "median of attention + backward (NaN for pass = forward)")
    forward_backward_useful_tflops: float = entry("TFLOP/s", "3.5 x useful FLOPs / median_forward_backward_s")
    flops_imbalance: float = entry("1", "largest / mean of the ranks' useful FLOPs (1: balanced; the backward's "
                                        "alike)")
    attention_imbalance: float = entry("1", "median over repeats of largest / mean of the ranks' attention times")
    backward_imbalance: float = entry("1", "median over repeats of largest / mean of the ranks' backward times "
                                           "(NaN for pass = forward)")


@dataclass(frozen=True)
class Accuracy:
    """The first call's output against float64 on sampled rows (attrs of ``accuracy``)."""

    PLACE: ClassVar[str] = "accuracy attrs"

    rows: int = entry("1", "rows sampled among those the patterns select")
    max_abs_err: float = entry("1", "largest absolute error")
    max_rel_err: float = entry("1", "max_abs_err / largest absolute reference value", column="max_rel_err")
    rel_l2_err: float = entry("1", "L2 norm of the error / L2 norm of the reference", column="rel_l2_err")
    selected_pairs: int = entry("1", "the sampled (row, head) pairs that some pattern selects",
                                column="checked_pairs")
    nonfinite: int = entry("1", "NaN/Inf values in the whole output (and gradients)")
    tolerance: float = entry("1", "max_rel_err (and grad_*_max_rel_err) allowed for the dtype")
    within_tolerance: bool = entry("-", "no NaN/Inf, max_rel_err and every grad_*_max_rel_err within tolerance")
    grad_q_max_rel_err: float = entry("1", "dQ of the sampled rows: largest absolute error / the larger of the "
                                           "largest absolute float64 value and the largest root-sum-square of an "
                                           "element's terms (NaN for pass = forward)")
    grad_q_rel_l2_err: float = entry("1", "dQ of the sampled rows: L2 norm of the error / the larger of the L2 "
                                          "norms of the float64 value and of its terms")
    grad_k_max_rel_err: float = entry("1", "dK, as grad_q_max_rel_err")
    grad_k_rel_l2_err: float = entry("1", "dK, as grad_q_rel_l2_err")
    grad_v_max_rel_err: float = entry("1", "dV, as grad_q_max_rel_err")
    grad_v_rel_l2_err: float = entry("1", "dV, as grad_q_rel_l2_err")

    @property
    def grad_max_rel_err(self) -> float:
        """The largest of the three gradients' ``max_rel_err`` (NaN for pass = forward)."""
        errors = (self.grad_q_max_rel_err, self.grad_k_max_rel_err, self.grad_v_max_rel_err)
        return math.nan if any(math.isnan(e) for e in errors) else max(errors)


@dataclass(frozen=True)
class Output:
    """The saved output (only with save_output): a virtual dataset over the part files; the gradients of a
    forward+backward case (``grad_q``, ``grad_k``, ``grad_v``) have the same attributes."""

    PLACE: ClassVar[str] = "output attrs"

    order: str = entry("-", "token order of the dataset (natural)")
    axes: str = entry("-", "the dataset's axes (batch, token, head, dim)")
    parts: str = entry("-", "JSON: the part files, relative to the results file")
    part_sha256: str = entry("-", "JSON: SHA-256 of each rank's block, rank order")


#: the datasets a case saves with save_output, each beside the others in the case and in its parts: the output
#: and, for pass = forward+backward, the gradients (natural order, the output's file dtype)
SAVED = ("output", "grad_q", "grad_k", "grad_v")


def saved_datasets(pass_: str) -> tuple[str, ...]:
    """The datasets of :data:`SAVED` that a case of ``pass_`` saves with save_output (all of them for
    forward+backward, the output alone otherwise): what a resume requires of a case it keeps."""
    return SAVED if pass_ == "forward+backward" else SAVED[:1]


#: every group of the record, in the order of docs/results.md
GROUPS: tuple[type, ...] = (Parameters, Setup, Bookkeeping, Timings, Metrics, Accuracy, Output)


@dataclass(frozen=True)
class CaseRecord:
    """What a run measured and decided for one case, as rank 0 writes it (parameters come from the case)."""

    setup: Setup
    timings: Timings
    metrics: Metrics
    accuracy: Accuracy


def unit(f: dataclasses.Field) -> str:
    """The unit of a record field."""
    return f.metadata["unit"]


def values(group: Any) -> Iterator[tuple[str, Any]]:
    """``(name, value)`` of every field of a record group instance, in field order."""
    for f in dataclasses.fields(group):
        yield key(f), getattr(group, f.name)


def names(group: type, kind: str = "") -> tuple[str, ...]:
    """The field names of a record group (of one ``kind`` when given)."""
    return tuple(key(f) for f in dataclasses.fields(group) if not kind or f.metadata["kind"] == kind)


def _times(kind: str) -> tuple[str, ...]:
    """The time counters (seconds) among the timings of ``kind``."""
    return tuple(f.name for f in dataclasses.fields(Timings) if f.metadata["kind"] == kind and unit(f) == "s")


#: the timings that measure phases of a call, and what the forward's ring counts (``distributed.ring.RingStats``)
PHASES = names(Timings, "phase")
RING_STATS = names(Timings, "ring")
#: the forward ring's time counters (seconds)
RING_TIMES = _times("ring")
#: the backward ring's counters, each with the ``RingStats`` field it records (its name without ``backward_``)
RING_BACKWARD_STATS = {name: name.removeprefix("backward_") for name in names(Timings, "ring_backward")}
#: the backward ring's time counters (seconds)
RING_BACKWARD_TIMES = _times("ring_backward")


def units(group: type) -> dict[str, str]:
    """Field name -> unit of a record group (``metrics`` stores this as JSON in its ``units`` attribute)."""
    return {key(f): unit(f) for f in dataclasses.fields(group)}


def read(group: type, attrs: Any, plain: Any) -> Any:
    """A record group as report reads it from HDF5 attributes: text fields as text ("" when absent), every
    other field as a float (NaN when absent or not a number); ``plain`` makes an attribute a Python value."""
    found = {}
    for f in dataclasses.fields(group):
        value = plain(attrs[key(f)]) if key(f) in attrs else None
        if f.type in ("str", str):
            found[f.name] = "" if value is None else str(value)
            continue
        try:
            found[f.name] = math.nan if value is None else float(value)
        except (TypeError, ValueError):
            found[f.name] = math.nan
    return group(**found)


def columns(*groups: Any) -> dict[str, Any]:
    """The cases-table columns of record group instances (fields with a ``column``), in field order."""
    return {f.metadata["column"]: getattr(g, f.name) for g in groups for f in dataclasses.fields(g)
            if f.metadata["column"]}


def doc_rows() -> list[tuple[str, str, str, str, str]]:
    """(where, field, type, unit, meaning) of every field: the table of docs/results.md."""
    return [(g.PLACE, key(f), str(f.type), unit(f), f.metadata["meaning"])
            for g in GROUPS for f in dataclasses.fields(g)]
