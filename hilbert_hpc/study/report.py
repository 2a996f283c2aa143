"""Analysis of results files: per-case statistics, scaling, orderings, communication, PyTorch peer, bandwidth.

``report(paths)`` pools the complete cases of one or more results files
(docs/results.md) and the sweeps of bandwidth files, recomputes every
statistic from the raw timings and prints plain-text tables (compact by
default, every column with ``wide``); it can also write all rows to one CSV
file and draw the scaling curves as PNG files, under the same ownership rules
as ``run``'s outputs (:class:`ReportOutputs`).

Statistics: for each repeat the slowest rank counts, ``t_rep = max over ranks``
of a timing; a case's time is the median over repeats of ``t_rep`` (with the
minimum and maximum over repeats as its spread).

Tables (each printed only when it has rows):

``cases``
    one row per case: median attention time [min, max], the spread
    max / min, tokens/s (``tokens * batch / median total``), useful TFLOP/s
    (``metrics.useful_flops / median attention``), max relative error.
``strong_scaling``
    cases with ``scaling == "strong"`` whose parameters are equal except
    ``ranks``, in groups of at least two rank counts; with ``p0`` the smallest
    rank count, ``speedup = T(p0) / T(P)`` and ``efficiency = speedup * p0 / P``.
``weak_scaling``
    cases with ``scaling == "weak"`` whose parameters are equal except
    ``ranks``, ``tokens``, ``grid`` and ``patterns``; ``efficiency = T(p0) / T(P)``.
``hilbert_vs_natural``
    cases equal except ``ordering`` and ``segment``, against the natural
    order: ``ratio = T(natural) / T(ordering)`` (> 1: the ordering is faster).
``compute_communication``
    cases on more than one rank: ring counters (local, compute, wait, pack,
    imbalance) and the share of waiting in the attention time.
``peer_ratio``
    each case whose backend is not ``torch`` against the ``torch`` case with
    equal parameters except backend, transport, ranks and scaling (preferably
    on one rank): ``ratio = T(peer) / T(case)`` and ``ratio / ranks`` per GPU.
``bandwidth``
    the ring exchange rate (GB/s) per message size of each bandwidth file.

Every ratio (speedup, efficiency, ordering, peer) comes with its range over
the repeats and a verdict (:func:`compare`): ``within noise`` when the [min,
max] times of the two cases overlap. Notes under a table flag repeats that
spread more than :data:`SPREAD_LIMIT` and scaling efficiencies above
:data:`EFFICIENCY_LIMIT`. Groups are labelled with the transport the cases
used (recorded per case), not the one requested (``auto``).

When several files hold cases with identical parameters (``params_json``
completed with ``ranks`` and ``scaling``), the case of the later file (by the
order given) is kept and a note says so.
"""

from __future__ import annotations

import csv
import json
import math
import os
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence, TextIO

import h5py
import numpy as np

from hilbert_hpc.errors import UserError
from hilbert_hpc.study.output_files import (OutputError, OutputLock, make_parent, move_into_place, os_reason, remove_quietly,
                           same_file, temporary_name)
from hilbert_hpc.study.results import READ_ERRORS, case_groups, output_notes, parts_dir

PROGRAM = "hilbert-hpc"
PARAM = "results"

#: The case parameters written as attributes (used when ``params_json`` is absent).
CASE_PARAMS = ("name", "tokens", "grid", "patterns", "batch", "heads", "head_dim", "causal", "ordering", "segment",
               "dtype", "backend", "scale", "transport", "input")

#: Table keys of the dictionary returned by :func:`report`, in print order, with their titles.
TABLES = {
    "cases": "cases (times: median over repeats of the slowest rank [min, max]; spread = max/min)",
    "strong_scaling": "strong scaling (speedup = T(p0)/T(P), efficiency = speedup * p0/P)",
    "weak_scaling": "weak scaling (efficiency = T(p0)/T(P))",
    "hilbert_vs_natural": "hilbert vs natural (ratio = T(natural)/T(ordering), > 1: faster than natural)",
    "compute_communication": "compute / communication (medians over repeats of the slowest rank)",
    "peer_ratio": "PyTorch peer (ratio = T(peer)/T(case), > 1: faster than the peer)",
    "bandwidth": "bandwidth (ring exchange, GB/s per rank: bytes sent / time of the slowest rank)",
}
#: Short table names for notes.
TITLES = {"cases": "cases", "strong_scaling": "strong scaling", "weak_scaling": "weak scaling",
          "hilbert_vs_natural": "hilbert vs natural", "compute_communication": "compute / communication",
          "peer_ratio": "PyTorch peer", "bandwidth": "bandwidth"}

#: A case whose slowest repeat took more than this many times its fastest gets a note (and ``!``).
SPREAD_LIMIT = 2.0
#: A scaling efficiency above this is superlinear beyond plausibility: a note (and ``!``).
EFFICIENCY_LIMIT = 1.1
#: Fewest repeats per case for a ratio's noise verdict (one repeat has no spread).
MIN_REPEATS = 2
#: Compact tables that would be wider than this show groups as keys explained under the table.
COMPACT_WIDTH = 120
#: Compact tables cut case ids longer than this (the numbered prefix that makes them unique stays).
CASE_WIDTH = 21
#: Cases named at most in one note.
NOTE_CASES = 6
#: ``Software`` text of the PNG files report writes: how a report recognizes its own plots.
PNG_SOFTWARE = "hilbert-hpc report"
#: A CSV file larger than this is not taken for a report's (not read to find out).
MAX_OWN_CSV_BYTES = 64 << 20

RING_COUNTERS = ("local_s", "compute_s", "wait_s", "pack_s", "imbalance_s")


@dataclass
class CaseResult:
    """One complete case of a results file, with its parameters and raw timings."""

    file: str
    case_id: str
    params: dict[str, Any]
    timings: dict[str, np.ndarray]
    useful_flops: float = math.nan
    max_rel_err: float = math.nan
    rel_l2_err: float = math.nan
    checked_pairs: float = math.nan     # the (row, head) pairs that a pattern selects among the checked rows
    transport_used: str = ""
    _stats: dict[str, tuple[float, float, float]] = field(default_factory=dict, repr=False)

    @property
    def ranks(self) -> int:
        """Number of ranks the case ran on."""
        return int(self.params["ranks"])

    @property
    def repeats(self) -> int:
        """Number of timed repeats (of the attention timing)."""
        per_rep = self.slowest("attention")
        return 0 if per_rep is None else int(per_rep.size)

    @property
    def tokens(self) -> int:
        """Sequence length N."""
        return int(self.params["tokens"])

    def slowest(self, name: str) -> np.ndarray | None:
        """Per repeat, the largest value over ranks of timing ``name`` (None when the file lacks it)."""
        values = self.timings.get(name)
        if values is None or values.size == 0:
            return None
        return np.atleast_2d(values).max(axis=0)

    def stats(self, name: str) -> tuple[float, float, float]:
        """(median, min, max) over repeats of the slowest rank's ``name``; NaNs when absent."""
        if name not in self._stats:
            per_rep = self.slowest(name)
            if per_rep is None:
                self._stats[name] = (math.nan, math.nan, math.nan)
            else:
                self._stats[name] = (float(np.median(per_rep)), float(per_rep.min()), float(per_rep.max()))
        return self._stats[name]

    def median(self, name: str) -> float:
        """Median over repeats of the slowest rank's ``name``."""
        return self.stats(name)[0]


# ----------------------------------------------------------------------------------------------------------------
# reading


def _plain(value: Any) -> Any:
    """An HDF5 attribute value as a plain Python value."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _is_true(value: Any) -> bool:
    """True only for a boolean attribute that is set."""
    return isinstance(value, (bool, np.bool_)) and bool(value)


def _case_params(group: h5py.Group, where: str) -> dict[str, Any]:
    """A case's parameters: ``params_json`` (else the attributes), completed with ``ranks`` and ``scaling``."""
    attrs = group.attrs
    text = _plain(attrs.get("params_json"))
    if text:
        try:
            params = json.loads(text)
        except (TypeError, ValueError):
            raise UserError(f"{where}: the attribute params_json is not valid JSON", PARAM) from None
        if not isinstance(params, dict):
            raise UserError(f"{where}: the attribute params_json is not a JSON object", PARAM)
    else:
        params = {key: _plain(attrs[key]) for key in CASE_PARAMS if key in attrs}
    if "ranks" not in params:
        if "ranks" in attrs:
            params["ranks"] = int(_plain(attrs["ranks"]))
        elif "timings" in group and "attention" in group["timings"]:
            params["ranks"] = int(np.atleast_2d(group["timings"]["attention"][()]).shape[0])
        else:
            raise UserError(f"{where}: the case records no rank count", PARAM)
    params.setdefault("scaling", "strong")
    if "tokens" not in params:
        grid = params.get("grid")
        if not grid:
            raise UserError(f"{where}: the case records neither tokens nor grid", PARAM)
        params["tokens"] = math.prod(grid)
    params["ranks"] = int(params["ranks"])
    params["tokens"] = int(params["tokens"])
    for key, default in (("name", ""), ("backend", ""), ("ordering", "natural"), ("transport", ""), ("batch", 1),
                         ("segment", 0)):
        params.setdefault(key, default)
    return params


def _read_case(path: str, cid: str, group: h5py.Group) -> CaseResult:
    """One complete case group as a CaseResult; a UserError naming the file and case when it is malformed."""
    where = f"{path!r}, case {cid}"
    params = _case_params(group, where)
    timings_group = group.get("timings")
    if not isinstance(timings_group, h5py.Group) or "attention" not in timings_group:
        raise UserError(f"{where}: no timings/attention dataset", PARAM)
    timings = {}
    for name, ds in timings_group.items():
        if isinstance(ds, h5py.Dataset):
            timings[name] = np.asarray(ds[()], dtype=np.float64)
    if timings["attention"].size == 0:
        raise UserError(f"{where}: timings/attention is empty", PARAM)
    metrics = group["metrics"].attrs if isinstance(group.get("metrics"), h5py.Group) else {}
    accuracy = group["accuracy"].attrs if isinstance(group.get("accuracy"), h5py.Group) else {}

    def number(attrs: Any, key: str) -> float:
        try:
            return float(_plain(attrs[key])) if key in attrs else math.nan
        except (TypeError, ValueError):
            return math.nan

    used = _plain(group.attrs.get("transport", params.get("transport", "")))
    return CaseResult(file=path, case_id=cid, params=params, timings=timings,
                      useful_flops=number(metrics, "useful_flops"), max_rel_err=number(accuracy, "max_rel_err"),
                      rel_l2_err=number(accuracy, "rel_l2_err"),
                      checked_pairs=number(accuracy, "selected_pairs"), transport_used=str(used))


def read_results_file(path: str | Path) -> tuple[list[CaseResult], int]:
    """The complete cases of one results file and the number of incomplete ones skipped.

    Raises UserError, naming the file, when it is missing, not HDF5, not a
    hilbert-hpc results file, malformed, or holds no complete case.
    """
    name = str(path)
    p = Path(path)
    if not p.exists():
        raise UserError(f"{name!r}: no such file", PARAM)
    if not p.is_file():
        raise UserError(f"{name!r}: not a file", PARAM)
    try:
        is_hdf5 = h5py.is_hdf5(p)
    except OSError as exc:
        raise UserError(f"{name!r}: cannot read the file ({exc})", PARAM) from None
    if not is_hdf5:
        raise UserError(f"{name!r}: not an HDF5 file", PARAM)
    try:
        h5 = h5py.File(p, "r")
    except OSError as exc:
        raise UserError(f"{name!r}: cannot open the HDF5 file ({exc}); if another job is writing it, wait, or "
                        f"set HDF5_USE_FILE_LOCKING=FALSE", PARAM) from None
    with h5:
        cases_group = h5.get("cases")
        if _plain(h5.attrs.get("program")) != PROGRAM or not isinstance(cases_group, h5py.Group):
            raise UserError(f"{name!r}: not a hilbert-hpc results file", PARAM)
        cases, skipped = [], 0
        try:
            listed = list(case_groups(cases_group))
        except READ_ERRORS as exc:
            raise UserError(f"{name!r}: the list of its cases cannot be read (a damaged file: {exc})",
                            PARAM) from None
        for cid, group, _ in listed:
            if group is None or not _is_true(group.attrs.get("complete")):
                skipped += 1             # unfinished, or unreadable (a write cut off by a full disk)
                continue
            try:
                cases.append(_read_case(name, cid, group))
            except UserError:
                raise
            except READ_ERRORS:                  # complete but damaged since: counted with the skipped ones
                skipped += 1
    if not cases:
        raise UserError(f"{name!r}: no complete cases (the job may have been stopped before its first case "
                        f"finished)", PARAM)
    return cases, skipped


def _key(params: dict[str, Any], drop: Iterable[str] = ()) -> str:
    """Canonical text of ``params`` without the keys in ``drop`` (the grouping key)."""
    drop = set(drop)
    return json.dumps({k: v for k, v in params.items() if k not in drop}, sort_keys=True)


def load_cases(paths: Sequence[str | Path]) -> tuple[list[CaseResult], list[str]]:
    """Pool the complete cases of ``paths`` (in order) and return them with note lines.

    Cases with identical parameters (including ``ranks`` and ``scaling``) are
    kept once: the later one by file order (then by case order) wins.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    if not paths:
        raise UserError("give at least one results file", PARAM)
    pooled: dict[str, CaseResult] = {}
    notes: list[str] = []
    for path in paths:
        cases, skipped = read_results_file(path)
        if skipped:
            notes.append(f"{str(path)!r}: {skipped} incomplete case(s) skipped (unfinished or unreadable)")
        notes += output_notes(path)              # complete cases whose saved output is lost or damaged
        for case in cases:
            key = _key(case.params)
            old = pooled.pop(key, None)
            if old is not None:
                notes.append(f"case {case.case_id} of {case.file!r} has the parameters of case {old.case_id} of "
                             f"{old.file!r}; keeping the later one ({case.file!r}, {case.case_id})")
            pooled[key] = case
    return list(pooled.values()), notes


@dataclass
class BandwidthSweep:
    """One ``hilbert-hpc bandwidth -o`` file: the ring exchange rate per message size of one transport."""

    file: str
    transport: str
    device: str
    ranks: int
    host: str
    sizes: list[tuple[int, float]]


def _root_study(path: str | Path) -> str | None:
    """The ``study`` root attribute of a hilbert-hpc HDF5 file (None for anything else or an unreadable file)."""
    try:
        with h5py.File(path, "r") as h5:
            if _plain(h5.attrs.get("program")) != PROGRAM:
                return None
            study = _plain(h5.attrs.get("study"))
            return str(study) if study else None
    except Exception:  # noqa: BLE001 - not HDF5, missing or unreadable: read_results_file says which
        return None


def read_bandwidth_file(path: str | Path) -> BandwidthSweep:
    """The sweep of a bandwidth file; a UserError naming the file when it is malformed."""
    name = str(path)
    try:
        with h5py.File(path, "r") as h5:
            ds = h5.get("bandwidth")
            data = np.asarray(ds[()], dtype=np.float64) if isinstance(ds, h5py.Dataset) else None
            attrs = {key: _plain(value) for key, value in ds.attrs.items()} if data is not None else {}
            host = str(_plain(h5.attrs.get("host", "")))
    except READ_ERRORS as exc:
        raise UserError(f"{name!r}: the bandwidth file cannot be read ({exc})", PARAM) from None
    if data is None or data.ndim != 2 or data.shape[1] != 2:
        raise UserError(f"{name!r}: a bandwidth file without a (sizes, 2) dataset 'bandwidth'", PARAM)
    return BandwidthSweep(file=name, transport=str(attrs.get("transport", "?")), device=str(attrs.get("device", "?")),
                          ranks=int(attrs.get("ranks", 0) or 0), host=host,
                          sizes=[(int(b), float(r)) for b, r in data])


def _owned_by(path: str | Path) -> tuple[list[tuple[Path, str]], list[tuple[Path, str]]]:
    """What a results file owns or names, which a report never writes: (files, folders), each with what it is.

    Files: the results file, its job file (root ``job_path``) and the cases'
    ``input`` files; folders: its output parts folder (``results.parts_dir``)
    and the folders its cases' outputs point to. Relative names count both from
    the current folder and from the results file's folder.
    """
    path = Path(path)
    files: list[tuple[Path, str]] = [(path, "file given to report")]
    folders: list[tuple[Path, str]] = [(parts_dir(path), f"output parts folder of {str(path)!r}")]

    def named(value: Any, what: str) -> None:
        text = _plain(value)
        if isinstance(text, str) and text:
            files.extend([(Path(text), what), (path.parent / text, what)])

    try:
        h5 = h5py.File(path, "r")
    except Exception:  # noqa: BLE001 - not HDF5 or unreadable: it names nothing more
        return files, folders
    with h5:
        named(h5.attrs.get("job_path"), f"job file of {str(path)!r}")
        cases = h5.get("cases")
        for cid, group, _ in (case_groups(cases) if isinstance(cases, h5py.Group) else ()):
            try:
                named(group.attrs.get("input"), f"input file of case {cid}")
                output = group.get("output")
                parts = json.loads(_plain(output.attrs.get("parts", "[]"))) if output is not None else []
            except Exception:  # noqa: BLE001 - a damaged case names nothing more
                continue
            for part in parts:
                top = Path(str(part)).parts
                if len(top) > 1:
                    folders.append((path.parent / top[0], f"output parts folder of {str(path)!r}"))
    return files, folders


@dataclass
class Loaded:
    """What the files given to a report hold, and what of theirs the report must never write."""

    cases: list[CaseResult]
    sweeps: list[BandwidthSweep]
    notes: list[str]
    protected_files: list[tuple[Path, str]]
    protected_folders: list[tuple[Path, str]]


def load_files(paths: Sequence[str | Path]) -> Loaded:
    """Read results files (pooled by :func:`load_cases`) and bandwidth files, in the order given."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not paths:
        raise UserError("give at least one results file", PARAM)
    is_sweep = {str(p): _root_study(p) == "bandwidth" for p in paths}
    results = [p for p in paths if not is_sweep[str(p)]]
    sweeps = [read_bandwidth_file(p) for p in paths if is_sweep[str(p)]]
    cases, notes = load_cases(results) if results else ([], [])
    files: list[tuple[Path, str]] = []
    folders: list[tuple[Path, str]] = []
    for path in paths:
        owned_files, owned_folders = _owned_by(path)
        files += owned_files
        folders += owned_folders
    return Loaded(cases, sweeps, notes, files, folders)


# ----------------------------------------------------------------------------------------------------------------
# tables


def _value_text(value: Any) -> str:
    """A parameter value in a label (compact JSON for lists)."""
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _label(params: dict[str, Any], base: Sequence[str], extra: Sequence[str]) -> str:
    """A group label: the ``base`` fields (tokens as N=, ranks as P=) then ``key=value`` for ``extra``."""
    parts = []
    for key in base:
        if key == "tokens":
            parts.append(f"N={params['tokens']}")
        elif key == "ranks":
            parts.append(f"P={params['ranks']}")
        else:
            parts.append(_value_text(params.get(key, "")))
    parts += [f"{key}={_value_text(params.get(key))}" for key in extra]
    return " ".join(p for p in parts if p)


def _varying(cases: Sequence[CaseResult], exclude: Iterable[str]) -> list[str]:
    """Parameter names whose values differ among ``cases`` (absent counts as a value), except ``exclude``."""
    exclude = set(exclude)
    keys = {k for c in cases for k in c.params} - exclude
    return sorted(k for k in keys if len({json.dumps(c.params.get(k), sort_keys=True) for c in cases}) > 1)


class _Labels:
    """Group labels that stay unique (a repeated label gets a ``#n`` suffix)."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def __call__(self, text: str) -> str:
        label, n = text, 1
        while label in self.used:
            n += 1
            label = f"{text} #{n}"
        self.used.add(label)
        return label


def _groups(cases: Iterable[CaseResult], drop: Iterable[str]) -> list[list[CaseResult]]:
    """Cases grouped by their parameters without ``drop``, groups in order of first appearance."""
    groups: dict[str, list[CaseResult]] = {}
    drop = tuple(drop)
    for case in cases:
        groups.setdefault(_key(case.params, drop), []).append(case)
    return list(groups.values())


def _timing_row(case: CaseResult, prefix: str = "attention") -> dict[str, float]:
    med, lo, hi = case.stats("attention")
    return {f"{prefix}_s": med, f"{prefix}_min_s": lo, f"{prefix}_max_s": hi}


def compare(reference: CaseResult, case: CaseResult) -> dict[str, Any]:
    """``T(reference) / T(case)`` on medians, its range over the repeats, and whether that range holds 1.

    The rule for every comparison of the report (docs/studies.md): with
    ``[lo, hi]`` the minimum and maximum over repeats of each case's time
    (slowest rank), ``ratio_min = lo_ref / hi_case`` and
    ``ratio_max = hi_ref / lo_case``. When ``ratio_min <= 1 <= ratio_max`` the
    two ranges overlap: the repeats do not show that the two cases differ, and
    ``noise`` is ``"within noise"``; otherwise ``"resolved"``. A case with
    fewer than :data:`MIN_REPEATS` repeats has no spread to judge by
    (``"too few repeats"``).
    """
    t_ref, lo_ref, hi_ref = reference.stats("attention")
    t, lo, hi = case.stats("attention")
    ratio = t_ref / t if t > 0 else math.nan
    ratio_min = lo_ref / hi if hi > 0 else math.nan
    ratio_max = hi_ref / lo if lo > 0 else math.nan
    if min(reference.repeats, case.repeats) < MIN_REPEATS:
        noise = "too few repeats"
    elif ratio_min <= 1.0 <= ratio_max:
        noise = "within noise"
    else:
        noise = "resolved"
    return {"ratio": ratio, "ratio_min": ratio_min, "ratio_max": ratio_max, "noise": noise}


def _transport_text(cases: Iterable[CaseResult]) -> str:
    """The transport the cases used (as recorded by each case; ``none`` on one rank), joined by ``/``.

    A group on one and several ranks is labelled by what its multi-rank
    cases used; files without the record fall back to the requested transport.
    """
    cases = list(cases)
    used = [c.transport_used or c.params["transport"] for c in cases]
    moving = [u for c, u in zip(cases, used) if c.ranks > 1 and u != "none"]
    return "/".join(dict.fromkeys(moving or used))


def _group_label(cases: Sequence[CaseResult], base: Sequence[str], extra: Sequence[str]) -> str:
    """:func:`_label` of the first case, with the transport the group actually used."""
    return _label(dict(cases[0].params, transport=_transport_text(cases)), base, extra)


def cases_table(cases: Sequence[CaseResult]) -> list[dict[str, Any]]:
    """One row per case: times (attention, and total with the copies around it), throughput, useful TFLOP/s,
    accuracy, and the spread of the repeats (slowest / fastest)."""
    rows = []
    for c in cases:
        p = c.params
        att, tot = c.stats("attention"), c.stats("total")
        tokens = c.tokens * int(p.get("batch", 1))
        rows.append({
            "case": c.case_id, "file": c.file, "name": p["name"], "ranks": c.ranks, "tokens": c.tokens,
            "backend": p["backend"], "dtype": p.get("dtype", ""), "causal": _is_true(p.get("causal")),
            "ordering": p["ordering"], "transport": c.transport_used or p["transport"],
            "attention_s": att[0], "attention_min_s": att[1], "attention_max_s": att[2],
            "total_s": tot[0], "total_min_s": tot[1], "total_max_s": tot[2],
            "attention_share": att[0] / tot[0] if tot[0] > 0 else math.nan,
            "tokens_per_s": tokens / tot[0] if tot[0] > 0 else math.nan,
            "tflops": c.useful_flops / att[0] / 1e12 if att[0] > 0 else math.nan,
            "max_rel_err": c.max_rel_err, "rel_l2_err": c.rel_l2_err, "checked_pairs": c.checked_pairs,
            "repeats": c.repeats, "spread": att[2] / att[1] if att[1] > 0 else math.nan,
        })
    return rows


def strong_scaling_table(cases: Sequence[CaseResult]) -> list[dict[str, Any]]:
    """Strong scaling: groups equal except ``ranks`` with at least two rank counts, against the fewest ranks."""
    groups = [sorted(g, key=lambda c: c.ranks) for g in _groups([c for c in cases if c.params["scaling"] == "strong"],
                                                                 ["ranks"])]
    groups = [g for g in groups if len({c.ranks for c in g}) >= 2]
    base_fields = ["name", "backend", "ordering", "transport", "tokens"]
    extra = _varying([c for g in groups for c in g], ["ranks", "scaling", *base_fields])
    labels, rows = _Labels(), []
    for group in groups:
        label = labels(_group_label(group, base_fields, extra))
        base = group[0]
        p0, t0 = base.ranks, base.median("attention")
        for c in group:
            vs = compare(base, c)
            noise = "" if c is base else vs["noise"]
            rows.append({"group": label, "case": c.case_id, "file": c.file, "ranks": c.ranks, **_timing_row(c),
                         "ideal_s": t0 * p0 / c.ranks, "speedup": vs["ratio"],
                         "efficiency": vs["ratio"] * p0 / c.ranks, "speedup_min": vs["ratio_min"],
                         "speedup_max": vs["ratio_max"], "noise": noise})
    return rows


def weak_scaling_table(cases: Sequence[CaseResult], notes: list[str] | None = None) -> list[dict[str, Any]]:
    """Weak scaling: groups equal except ranks, tokens, grid and patterns, against the fewest ranks.

    A group holding one rank count more than once is split by tokens per
    rank; a series still repeating a rank count is left out (with a note).
    """
    free = ["ranks", "tokens", "grid", "patterns"]
    series: list[list[CaseResult]] = []
    for group in _groups([c for c in cases if c.params["scaling"] == "weak"], free):
        if len({c.ranks for c in group}) == len(group):
            series.append(group)
            continue
        by_density: dict[Fraction, list[CaseResult]] = {}
        for c in group:
            by_density.setdefault(Fraction(c.tokens, c.ranks), []).append(c)
        for sub in by_density.values():
            if len({c.ranks for c in sub}) == len(sub):
                series.append(sub)
            elif notes is not None:
                ids = ", ".join(f"{c.case_id} ({c.file!r})" for c in sub)
                notes.append(f"weak scaling: cases {ids} repeat a rank count at equal tokens per rank; left out")
    series = [sorted(s, key=lambda c: c.ranks) for s in series if len({c.ranks for c in s}) >= 2]
    base_fields = ["name", "backend", "ordering", "transport"]
    extra = _varying([c for s in series for c in s], [*free, "scaling", *base_fields])
    labels, rows = _Labels(), []
    for s in series:
        per_rank = Fraction(s[0].tokens, s[0].ranks)
        density = per_rank.numerator if per_rank.denominator == 1 else float(per_rank)
        label = labels(_group_label(s, base_fields, extra) + f" N/P={density}")
        base = s[0]
        t0 = base.median("attention")
        for c in s:
            vs = compare(base, c)
            rows.append({"group": label, "case": c.case_id, "file": c.file, "ranks": c.ranks, "tokens": c.tokens,
                         **_timing_row(c), "ideal_s": t0, "efficiency": vs["ratio"],
                         "efficiency_min": vs["ratio_min"], "efficiency_max": vs["ratio_max"],
                         "noise": "" if c is base else vs["noise"]})
    return rows


def hilbert_vs_natural_table(cases: Sequence[CaseResult]) -> list[dict[str, Any]]:
    """Each non-natural ordering against the natural-order case with otherwise equal parameters."""
    free = ["ordering", "segment"]
    groups = []
    for group in _groups(cases, free):
        natural = [c for c in group if c.params["ordering"] == "natural"]
        others = [c for c in group if c.params["ordering"] != "natural"]
        if natural and others:
            groups.append((natural[-1], sorted(others, key=lambda c: (c.params["ordering"], c.params["segment"]))))
    base_fields = ["name", "backend", "transport", "tokens", "ranks"]
    extra = _varying([c for n, o in groups for c in (n, *o)], [*free, *base_fields])
    labels, rows = _Labels(), []
    for natural, others in groups:
        label = labels(_group_label([natural, *others], base_fields, extra))
        for c in others:
            vs = compare(natural, c)
            rows.append({"group": label, "case": c.case_id, "file": c.file, "natural_case": natural.case_id,
                         "natural_file": natural.file, "ordering": c.params["ordering"],
                         "segment": c.params.get("segment") or 0, **_timing_row(natural, "natural"),
                         **_timing_row(c), **vs})
    return rows


def compute_communication_table(cases: Sequence[CaseResult]) -> list[dict[str, Any]]:
    """Ring counters of the cases on more than one rank, and the share of waiting in the attention time."""
    rows = []
    for c in cases:
        if c.ranks <= 1:
            continue
        att = c.median("attention")
        row: dict[str, Any] = {"case": c.case_id, "file": c.file, "name": c.params["name"], "ranks": c.ranks,
                               "backend": c.params["backend"], "transport": c.transport_used or c.params["transport"],
                               "attention_s": att}
        row.update({name: c.median(name) for name in RING_COUNTERS})
        row["wait_share"] = row["wait_s"] / att if att > 0 else math.nan
        rows.append(row)
    return rows


def peer_ratio_table(cases: Sequence[CaseResult]) -> list[dict[str, Any]]:
    """Each non-torch case against its PyTorch peer (equal parameters except backend, transport, ranks, scaling).

    Among several peers the one on one rank is preferred, then the fewest
    ranks, then the later one loaded.
    """
    free = ["backend", "transport", "ranks", "scaling"]
    peers: dict[str, list[tuple[int, CaseResult]]] = defaultdict(list)
    for i, c in enumerate(cases):
        if c.params["backend"] == "torch":
            peers[_key(c.params, free)].append((i, c))
    pairs = []
    for c in cases:
        if c.params["backend"] == "torch":
            continue
        found = peers.get(_key(c.params, free))
        if found:
            _, peer = min(found, key=lambda ic: (ic[1].ranks != 1, ic[1].ranks, -ic[0]))
            pairs.append((c, peer))
    base_fields = ["name", "tokens"]
    extra = _varying([c for pair in pairs for c in pair], [*free, *base_fields])
    rows = []
    for c, peer in pairs:
        vs = compare(peer, c)
        rows.append({"group": _label(c.params, base_fields, extra), "case": c.case_id, "file": c.file,
                     "backend": c.params["backend"], "ranks": c.ranks, "attention_s": c.median("attention"),
                     "peer_case": peer.case_id, "peer_file": peer.file, "peer_ranks": peer.ranks,
                     "peer_s": peer.median("attention"), **vs, "ratio_per_gpu": vs["ratio"] / c.ranks})
    return rows


def bandwidth_table(sweeps: Sequence[BandwidthSweep]) -> list[dict[str, Any]]:
    """One row per message size of each bandwidth sweep, labelled by transport, buffers and ranks."""
    labels, rows = _Labels(), []
    for sweep in sweeps:
        label = labels(f"{sweep.transport} {sweep.device} P={sweep.ranks}")
        for nbytes, rate in sweep.sizes:
            rows.append({"sweep": label, "file": sweep.file, "transport": sweep.transport, "device": sweep.device,
                         "ranks": sweep.ranks, "host": sweep.host, "bytes": nbytes, "gb_per_s": rate})
    return rows


def build_tables(cases: Sequence[CaseResult], notes: list[str] | None = None,
                 sweeps: Sequence[BandwidthSweep] = ()) -> dict[str, list[dict[str, Any]]]:
    """Every table's rows (keys of :data:`TABLES`); notes about left-out data are appended to ``notes``."""
    return {
        "cases": cases_table(cases),
        "strong_scaling": strong_scaling_table(cases),
        "weak_scaling": weak_scaling_table(cases, notes),
        "hilbert_vs_natural": hilbert_vs_natural_table(cases),
        "compute_communication": compute_communication_table(cases),
        "peer_ratio": peer_ratio_table(cases),
        "bandwidth": bandwidth_table(sweeps),
    }


def table_notes(name: str, rows: Sequence[dict[str, Any]]) -> list[str]:
    """Warnings about a table's rows: repeats spread beyond :data:`SPREAD_LIMIT`, efficiency beyond
    :data:`EFFICIENCY_LIMIT`, and the ratios that are within the repeats' spread (:func:`compare`)."""
    notes = []
    for row in rows:
        if name == "cases" and row["spread"] > SPREAD_LIMIT:
            notes.append(f"case {row['case']}: repeats spread {row['spread']:.3g}x (slowest / fastest, limit "
                         f"{SPREAD_LIMIT:g}x): its median is not a steady figure; rerun with more repeats")
        if name in ("strong_scaling", "weak_scaling") and row["efficiency"] > EFFICIENCY_LIMIT:
            notes.append(f"{TITLES[name]} {row['group']} P={row['ranks']}: efficiency {row['efficiency']:.3g} is "
                         f"implausibly superlinear (> {EFFICIENCY_LIMIT:g}); check the cases' spread")
    for verdict, meaning in (("within noise", "the two cases' [min, max] times over repeats overlap"),
                             ("too few repeats", f"fewer than {MIN_REPEATS} repeats: no spread to judge by")):
        marked = [row for row in rows if row.get("noise") == verdict]
        if marked:
            compared = sum(1 for row in rows if row.get("noise"))
            cases = ", ".join(row["case"] for row in marked[:NOTE_CASES]) + (", ..." if len(marked) > NOTE_CASES
                                                                             else "")
            notes.append(f"{TITLES[name]}: {len(marked)} of {compared} ratio(s) {verdict} ({cases}): {meaning}")
    return notes


# ----------------------------------------------------------------------------------------------------------------
# output


def _ms(value: float) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value * 1e3:.4g}"


def _fmt(spec: str) -> Callable[[Any], str]:
    def fmt(value: Any) -> str:
        if isinstance(value, float) and not math.isfinite(value):
            return "-"
        return format(value, spec)
    return fmt


def _key_of(name: str, fmt: Callable[[Any], str] = str) -> Callable[[dict], str]:
    return lambda row: fmt(row[name])


def _range_ms(prefix: str) -> Callable[[dict], str]:
    return lambda row: (f"{_ms(row[f'{prefix}_s'])} [{_ms(row[f'{prefix}_min_s'])}, "
                        f"{_ms(row[f'{prefix}_max_s'])}]")


def _flagged(name: str, limit: float, spec: str) -> Callable[[dict], str]:
    """A number with ``!`` after it when it exceeds ``limit`` (a note under the table says why)."""
    fmt = _fmt(spec)
    return lambda row: fmt(row[name]) + ("!" if row[name] > limit else "")


def _ratio_range(name: str) -> Callable[[dict], str]:
    return lambda row: f"[{_fmt('.2f')(row[name + '_min'])}, {_fmt('.2f')(row[name + '_max'])}]"


@dataclass(frozen=True)
class Col:
    """A printed column: its title, the cell text of a row, its compact title (None: only with ``--wide``)."""

    title: str
    cell: Callable[[dict], str]
    short: str | None = ""
    text: bool = False
    limit: int = 0              # compact: longer cells are cut to this many characters, ending in "..."
    fold: bool = False          # compact: when every row has the same value, said once under the table instead
    abbrev: dict[str, str] = field(default_factory=dict)   # compact: shorter spellings of cell values

    def heading(self, wide: bool) -> str:
        """The column title in the chosen layout."""
        return self.title if wide or not self.short else self.short

    def text_of(self, row: dict, wide: bool) -> str:
        """The cell of ``row`` in the chosen layout."""
        cell = self.cell(row)
        if not wide:
            cell = self.abbrev.get(cell, cell)
        if wide or not self.limit or len(cell) <= self.limit:
            return cell
        return cell[:self.limit - 3] + "..."


def _text(name: str, short: str | None = "", limit: int = 0, fold: bool = False) -> Col:
    return Col(name, _key_of(name), short, text=True, limit=limit, fold=fold)


#: compact spellings of dtypes in the cases table
DTYPE_ABBREVIATIONS = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}
_FILE = _text("file", "f")      # compact: the file's number in the list printed under the first line
_CASE = _text("case", limit=CASE_WIDTH)
_NOISE = Col("vs spread", _key_of("noise"), "noise", text=True)

#: Printed columns per table (the CSV has every field of every row).
COLUMNS: dict[str, list[Col]] = {
    "cases": [_CASE, _FILE, _text("name", None), Col("ranks", _key_of("ranks"), "P"),
              Col("tokens", _key_of("tokens", _fmt(",")), "N"), _text("backend", fold=True), Col("dtype", _key_of("dtype"), text=True, fold=True, abbrev=DTYPE_ABBREVIATIONS),
              Col("causal", lambda r: "yes" if r["causal"] else "no", text=True, fold=True),
              _text("ordering", "order"), _text("transport", "transp.", fold=True), Col("attn ms [min, max]", _range_ms("attention")),
              Col("spread", _flagged("spread", SPREAD_LIMIT, ".3g")),
              Col("total ms", _key_of("total_s", _ms), None),
              Col("attn/total", _key_of("attention_share", _fmt(".2f")), None),
              Col("tokens/s", _key_of("tokens_per_s", _fmt(".3g")), None),
              Col("TFLOP/s", _key_of("tflops", _fmt(".3g"))),
              Col("max rel err", _key_of("max_rel_err", _fmt(".1e")), "err"),
              Col("checked (row, head) pairs", _key_of("checked_pairs", _fmt(",.0f")), None)],
    "strong_scaling": [_text("group"), Col("ranks", _key_of("ranks"), "P"),
                       Col("attn ms [min, max]", _range_ms("attention")),
                       Col("ideal ms", _key_of("ideal_s", _ms), None), Col("speedup", _key_of("speedup", _fmt(".2f"))),
                       Col("speedup range", _ratio_range("speedup"), None),
                       Col("efficiency", _flagged("efficiency", EFFICIENCY_LIMIT, ".2f"), "effic."), _NOISE],
    "weak_scaling": [_text("group"), Col("ranks", _key_of("ranks"), "P"),
                     Col("tokens", _key_of("tokens", _fmt(",")), "N"),
                     Col("attn ms [min, max]", _range_ms("attention")),
                     Col("efficiency", _flagged("efficiency", EFFICIENCY_LIMIT, ".2f"), "effic."),
                     Col("efficiency range", _ratio_range("efficiency"), None), _NOISE],
    "hilbert_vs_natural": [_text("group"),
                           Col("ordering", lambda r: r["ordering"] + (f"/{r['segment']}" if r["segment"] else ""),
                               "order", text=True),
                           Col("natural ms [min, max]", _range_ms("natural"), "natural ms"),
                           Col("attn ms [min, max]", _range_ms("attention"), "attn ms"),
                           Col("ratio", _key_of("ratio", _fmt(".2f"))),
                           Col("ratio range", _ratio_range("ratio"), None), _NOISE],
    "compute_communication": [_CASE, Col("ranks", _key_of("ranks"), "P"), _text("transport"),
                              Col("attn ms", _key_of("attention_s", _ms)), Col("local ms", _key_of("local_s", _ms)),
                              Col("compute ms", _key_of("compute_s", _ms)), Col("wait ms", _key_of("wait_s", _ms)),
                              Col("pack ms", _key_of("pack_s", _ms)),
                              Col("imbalance ms", _key_of("imbalance_s", _ms), "imbal. ms"),
                              Col("wait share", _key_of("wait_share", _fmt(".1%")))],
    "peer_ratio": [_text("group"), _CASE, _text("backend"), Col("ranks", _key_of("ranks"), "P"),
                   Col("attn ms", _key_of("attention_s", _ms)), Col("peer case", _key_of("peer_case"), None, text=True),
                   Col("peer ms", _key_of("peer_s", _ms)), Col("ratio", _key_of("ratio", _fmt(".2f"))),
                   Col("ratio range", _ratio_range("ratio"), None),
                   Col("ratio/GPU", _key_of("ratio_per_gpu", _fmt(".2f"))), _NOISE],
}


def _size_text(nbytes: int) -> str:
    """A message size in the largest binary unit that divides it (``256 MiB``), else in bytes."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def _bandwidth_columns(rows: Sequence[dict[str, Any]]) -> tuple[list[Col], list[dict[str, Any]]]:
    """The bandwidth table pivoted for print: one row per size, one GB/s column per sweep."""
    sweeps = list(dict.fromkeys(r["sweep"] for r in rows))
    by_size: dict[int, dict[str, Any]] = {}
    for r in rows:
        by_size.setdefault(r["bytes"], {"bytes": r["bytes"]})[r["sweep"]] = r["gb_per_s"]
    columns = [Col("size", lambda r: _size_text(r["bytes"]))]
    columns += [Col(f"{s} GB/s", lambda r, s=s: _fmt(".3f")(r.get(s, math.nan))) for s in sweeps]
    return columns, [by_size[b] for b in sorted(by_size)]


def _group_key(i: int) -> str:
    return f"g{i + 1}"


def format_table(name: str, rows: Sequence[dict[str, Any]], wide: bool = True,
                 files: dict[str, int] | None = None) -> str:
    """One table as aligned plain text (title, column titles, rule, rows); text left, numbers right.

    Compact (``wide=False``): only the columns with a compact title, the file as
    its number in ``files`` (left out for one file), and when the table is still
    wider than :data:`COMPACT_WIDTH`, groups as keys explained under the table.
    """
    legend: list[str] = []
    if name == "bandwidth":
        columns, rows = _bandwidth_columns(rows)
    else:
        columns = [c for c in COLUMNS[name] if wide or c.short is not None]
        if not wide:
            if len(files or {}) > 1:
                rows = [dict(r, file=str(files[r["file"]])) for r in rows]
            else:
                columns = [c for c in columns if c is not _FILE]
            same = [c for c in columns if c.fold and len(rows) > 1 and len({c.text_of(r, wide) for r in rows}) == 1]
            if same:
                legend.append("  every row: " + ", ".join(f"{c.title} {c.text_of(rows[0], wide)}" for c in same))
                columns = [c for c in columns if c not in same]
    text = _layout(name, columns, rows, wide)
    if not wide and max(map(len, text.splitlines())) > COMPACT_WIDTH and any(c.title == "group" for c in columns):
        keys = {g: _group_key(i) for i, g in enumerate(dict.fromkeys(r["group"] for r in rows))}
        legend += [f"  {key} = {group}" for group, key in keys.items()]
        text = _layout(name, columns, [dict(r, group=keys[r["group"]]) for r in rows], wide)
    return "\n".join([text, *legend])


def _layout(name: str, columns: Sequence[Col], rows: Sequence[dict[str, Any]], wide: bool) -> str:
    cells = [[c.text_of(row, wide) for c in columns] for row in rows]
    titles = [c.heading(wide) for c in columns]
    widths = [max([len(t)] + [len(r[i]) for r in cells]) for i, t in enumerate(titles)]
    aligns = ["<" if c.text else ">" for c in columns]

    def line(values: Sequence[str]) -> str:
        return "  ".join(f"{v:{a}{w}}" for v, a, w in zip(values, aligns, widths)).rstrip()

    out = [TABLES[name], line(titles), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out)


def print_tables(tables: dict[str, list[dict[str, Any]]], stream: TextIO | None = None, wide: bool = True,
                 files: dict[str, int] | None = None) -> None:
    """Print every table that has rows, each followed by its notes, separated by blank lines."""
    stream = stream or sys.stdout
    first = True
    for name in TABLES:
        if tables.get(name):
            if not first:
                print(file=stream)
            print(format_table(name, tables[name], wide, files), file=stream)
            for note in table_notes(name, tables[name]):
                print(f"note: {note}", file=stream)
            first = False


def _csv_value(value: Any) -> Any:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return value


def _write_csv_rows(tables: dict[str, list[dict[str, Any]]], f: TextIO) -> None:
    """All rows of all tables: column ``table`` first, then the union of the rows' columns."""
    columns: dict[str, None] = {"table": None}
    for name in TABLES:
        for row in tables.get(name, []):
            columns.update(dict.fromkeys(row))
    writer = csv.DictWriter(f, fieldnames=list(columns), restval="")
    writer.writeheader()
    for name in TABLES:
        for row in tables.get(name, []):
            writer.writerow({"table": name, **{k: _csv_value(v) for k, v in row.items()}})


def _series(rows: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(row["group"], []).append(row)
    return out


def scaling_figure(rows: Sequence[dict[str, Any]], title: str, efficiency_title: str, log_time: bool) -> Any:
    """Two panels: time (with the ideal, dashed) and efficiency (with 1.0) against ranks on a log2 axis;
    one series per group, labelled by the group (with the transport each group used)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax_t, ax_e = fig.subplots(1, 2)
    all_ranks: set[int] = set()
    for i, (label, series) in enumerate(_series(rows).items()):
        color = f"C{i % 10}"
        ranks = [r["ranks"] for r in series]
        all_ranks.update(ranks)
        med = np.array([r["attention_s"] for r in series])
        err = np.array([med - [r["attention_min_s"] for r in series], [r["attention_max_s"] for r in series] - med])
        ax_t.errorbar(ranks, med, yerr=err, marker="o", color=color, capsize=3, label=label)
        ax_t.plot(ranks, [r["ideal_s"] for r in series], linestyle="--", color=color, alpha=0.6)
        ax_e.plot(ranks, [r["efficiency"] for r in series], marker="o", color=color, label=label)
    ticks = sorted(all_ranks)
    for ax in (ax_t, ax_e):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("ranks")
        ax.grid(True, alpha=0.3)
    if log_time:
        ax_t.set_yscale("log")
    else:
        ax_t.set_ylim(bottom=0)
    ax_t.set_ylabel("attention time, s (slowest rank, median; dashed: ideal)")
    ax_t.set_title(title)
    ax_e.axhline(1.0, color="black", linewidth=1, linestyle=":")
    top = max([1.0] + [r["efficiency"] for r in rows if math.isfinite(r["efficiency"])])
    ax_e.set_ylim(0, 1.1 * top)
    ax_e.set_ylabel("efficiency")
    ax_e.set_title(efficiency_title)
    ax_e.legend(fontsize="small")
    return fig


#: The plots: table, file name, titles, log time axis.
PLOTS = (("strong_scaling", "strong_scaling.png", "strong scaling", "efficiency = T(p0) p0 / (T(P) P)", True),
         ("weak_scaling", "weak_scaling.png", "weak scaling (ideal: flat)", "efficiency = T(p0) / T(P)", False))


# ----------------------------------------------------------------------------------------------------------------
# the files a report writes


def is_report_csv(path: Path) -> bool:
    """True for a CSV file written by report: header ``table,...`` and every row of a known table."""
    try:
        if path.stat().st_size > MAX_OWN_CSV_BYTES:
            return False
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if not header or header[0] != "table":          # a report of no rows has the header "table" alone
                return False
            return all(row and row[0] in TABLES for row in reader)
    except (OSError, UnicodeDecodeError, csv.Error):
        return False


def is_report_png(path: Path) -> bool:
    """True for a PNG file whose ``Software`` text chunk says report wrote it (:data:`PNG_SOFTWARE`)."""
    try:
        with path.open("rb") as f:
            if f.read(8) != b"\x89PNG\r\n\x1a\n":
                return False
            while True:
                head = f.read(8)
                if len(head) < 8:
                    return False
                length, kind = int.from_bytes(head[:4], "big"), head[4:]
                if kind == b"tEXt" and length < 4096:
                    key, _, value = f.read(length).partition(b"\0")
                    if key == b"Software" and value == PNG_SOFTWARE.encode():
                        return True
                    f.seek(4, 1)
                    continue
                if kind in (b"IDAT", b"IEND"):
                    return False
                f.seek(length + 4, 1)
    except OSError:
        return False


@dataclass
class Target:
    """One file a report writes: where, the option that named it, what it is, and how to recognize one of ours."""

    path: Path
    option: str
    kind: str
    is_ours: Callable[[Path], bool]


def _inside(path: Path, folder: Path) -> bool:
    """True when ``path`` is ``folder`` or lies under it (after resolving links)."""
    path, folder = path.resolve(), folder.resolve()
    return path == folder or folder in path.parents


class ReportOutputs:
    """The CSV file and plots of one report, claimed before anything is printed and written whole.

    The rules of ``run``'s outputs (hilbert_hpc/output_files.py) with a report's
    owned files: a target may not be a file given to the report, a job or input
    file they name, anything inside their output parts folders, a folder or a
    special file; an existing target is replaced only when report wrote it
    (:func:`is_report_csv`, :func:`is_report_png`) and ``overwrite`` is set.
    Each target is locked (``<target>.lock``, as ``run`` locks a results file)
    from the checks to the end, and written under a temporary name renamed
    into place.
    """

    def __init__(self, targets: Sequence[Target], loaded: Loaded, overwrite: bool = False) -> None:
        self.targets, self.loaded, self.overwrite = list(targets), loaded, overwrite
        self.locks: list[OutputLock] = []

    def _refuse_protected(self, target: Target) -> None:
        path, choose = target.path, f"choose another {target.option}"
        for other, what in self.loaded.protected_files:
            if same_file(path, other):
                raise UserError(f"{str(path)!r} is the {what}; it is never replaced: {choose}", target.option)
        for folder, what in self.loaded.protected_folders:
            if _inside(path, folder):
                raise UserError(f"{str(path)!r} is inside {str(folder)!r}, the {what}: {choose}", target.option)
        if path.is_dir():
            raise UserError(f"{str(path)!r} is a folder: {choose} file name", target.option)
        if path.exists() and not path.is_file():
            raise UserError(f"{str(path)!r} is not a regular file: {choose}", target.option)
        if path.parent.exists() and not path.parent.is_dir():
            raise UserError(f"{str(path.parent)!r} is not a folder: {choose}", target.option)

    def _refuse_existing(self, target: Target) -> None:
        path = target.path
        if not path.exists():
            return
        if not target.is_ours(path):
            raise UserError(f"{str(path)!r} exists and is not a {target.kind} written by hilbert-hpc report; it is "
                            f"not replaced: move it away or choose another {target.option}", target.option)
        if not self.overwrite:
            raise UserError(f"{str(path)!r} exists; replace it with --overwrite or choose another {target.option}",
                            target.option)

    def __enter__(self) -> "ReportOutputs":
        paths = [t.path.resolve() for t in self.targets]
        if len(set(paths)) < len(paths):
            raise UserError("the CSV file is also one of the plot files: choose another --csv", "--csv")
        for target in self.targets:
            self._refuse_protected(target)
        try:
            for target in self.targets:
                make_parent(target.path)
                self._lock(target)
                self._refuse_existing(target)
        except BaseException:
            self.release()
            raise
        return self

    def _lock(self, target: Target) -> None:
        """Lock ``target`` as ``run`` locks its output; held by another command, refuse it naming the option."""
        try:
            self.locks.append(OutputLock(target.path).acquire())
        except OutputError as exc:
            cause = exc.message.split("; ")[0]
            raise UserError(f"{cause}; wait for it to end or choose another {target.option}", target.option) from None

    def release(self) -> None:
        """Drop every lock taken."""
        for lock in self.locks:
            lock.release()
        self.locks = []

    def __exit__(self, *exc: object) -> None:
        self.release()

    def write(self, target: Target, fill: Callable[[Path], None]) -> None:
        """``fill(tmp)`` writes the new file under a temporary name, then it is renamed over ``target``."""
        tmp = temporary_name(target.path)
        try:
            fill(tmp)
            move_into_place(tmp, target.path)
        except OSError as exc:
            remove_quietly(tmp)
            raise UserError(f"cannot write {str(target.path)!r}: {os_reason(exc)}", target.option) from None
        except BaseException:
            remove_quietly(tmp)
            raise


def _csv_filler(tables: dict[str, list[dict[str, Any]]]) -> Callable[[Path], None]:
    def fill(tmp: Path) -> None:
        with tmp.open("w", newline="", encoding="utf-8") as f:
            _write_csv_rows(tables, f)
            f.flush()
            os.fsync(f.fileno())
    return fill


def _plot_filler(rows: Sequence[dict[str, Any]], title: str, eff_title: str, log_time: bool) -> Callable[[Path], None]:
    def fill(tmp: Path) -> None:
        fig = scaling_figure(rows, title, eff_title, log_time)
        fig.savefig(tmp, format="png", dpi=120, metadata={"Software": PNG_SOFTWARE})
    return fill


def _need_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError("plots need matplotlib: install the 'plot' extra (pip install 'hilbert_hpc[plot]')",
                        "--plot") from None


def _plot_targets(tables: dict[str, list[dict[str, Any]]],
                  plot_dir: str | Path | None) -> list[tuple[Target, tuple[Any, ...]]]:
    """The plots to write (those whose table has rows), each with its entry of :data:`PLOTS`."""
    if plot_dir is None:
        return []
    _need_matplotlib()
    directory = Path(plot_dir)
    if directory.exists() and not directory.is_dir():
        raise UserError(f"{str(directory)!r} is not a folder: choose another --plot folder", "--plot")
    return [(Target(directory / plot[1], "--plot", "plot", is_report_png), plot) for plot in PLOTS
            if tables.get(plot[0])]


def report(paths: Sequence[str | Path], stream: TextIO | None = None, csv_path: str | Path | None = None,
           plot_dir: str | Path | None = None, overwrite: bool = False, wide: bool = False) -> dict[str, list[Any]]:
    """Print the tables; write CSV / PNG plots when asked; return the table rows (for tests).

    Every refusal of an output (:class:`ReportOutputs`) comes before anything
    is printed or written. ``wide`` prints every column; the compact default
    fits about :data:`COMPACT_WIDTH` columns (the CSV always has every field).
    The result maps each table name of :data:`TABLES` to its rows (dicts,
    times in seconds), ``"notes"`` to the note lines printed and ``"plots"``
    to the PNG files written.
    """
    stream = stream or sys.stdout
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    loaded = load_files(paths)
    notes = loaded.notes
    tables: dict[str, list[Any]] = build_tables(loaded.cases, notes, loaded.sweeps)
    csv_target = [Target(Path(csv_path), "--csv", "CSV file", is_report_csv)] if csv_path is not None else []
    plots = _plot_targets(tables, plot_dir)
    files = {str(p): i + 1 for i, p in enumerate(dict.fromkeys(str(p) for p in paths))}
    with ReportOutputs(csv_target + [target for target, _ in plots], loaded, overwrite) as out:
        # written before anything is printed: a reader that leaves early (| head) cannot cost the files
        if csv_target:
            out.write(csv_target[0], _csv_filler(tables))
        for target, (name, _, title, eff_title, log_time) in plots:
            out.write(target, _plot_filler(tables[name], title, eff_title, log_time))
        what = f"{len(loaded.cases)} case(s)" + (f", {len(loaded.sweeps)} bandwidth sweep(s)" if loaded.sweeps
                                                 else "")
        print(f"hilbert-hpc report: {what} from {len(files)} file(s)", file=stream)
        if not wide and len(files) > 1:
            for path, number in files.items():
                print(f"  file {number}: {path}", file=stream)
        for note in notes:
            print(f"note: {note}", file=stream)
        print(file=stream)
        print_tables(tables, stream, wide, files)
        if csv_target:
            print(f"\ncsv -> {csv_path}", file=stream)
        for target, _ in plots:
            print(f"plot -> {target.path}", file=stream)
        if plot_dir is not None and not plots:
            print(f"plot: no strong or weak scaling series; nothing written to {str(plot_dir)!r}", file=stream)
    tables["notes"] = notes + [n for name in TABLES for n in table_notes(name, tables.get(name, []))]
    tables["plots"] = [str(target.path) for target, _ in plots]
    return tables
