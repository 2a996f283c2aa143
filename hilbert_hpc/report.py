"""Analysis of results files: per-case statistics, scaling, orderings, communication, PyTorch peer.

``report(paths)`` pools the complete cases of one or more results files
(docs/results.md), recomputes every statistic from the raw timings and prints
plain-text tables; it can also write all rows to one CSV file and draw the
scaling curves as PNG files.

Statistics: for each repeat the slowest rank counts, ``t_rep = max over ranks``
of a timing; a case's time is the median over repeats of ``t_rep`` (with the
minimum and maximum over repeats as its spread).

Tables (each printed only when it has rows):

``cases``
    one row per case: median attention time [min, max], tokens/s
    (``tokens * batch / median total``), useful TFLOP/s
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

When several files hold cases with identical parameters (``params_json``
completed with ``ranks`` and ``scaling``), the case of the later file (by the
order given) is kept and a note says so.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence, TextIO

import h5py
import numpy as np

from .errors import UserError
from .results import READ_ERRORS, case_groups, output_notes

PROGRAM = "hilbert-hpc"
PARAM = "results"

#: The case parameters written as attributes (used when ``params_json`` is absent).
CASE_PARAMS = ("name", "tokens", "grid", "patterns", "batch", "heads", "head_dim", "causal", "ordering", "segment",
               "dtype", "backend", "scale", "transport", "input")

#: Table keys of the dictionary returned by :func:`report`, in print order, with their titles.
TABLES = {
    "cases": "cases (times: median over repeats of the slowest rank [min, max])",
    "strong_scaling": "strong scaling (speedup = T(p0)/T(P), efficiency = speedup * p0/P)",
    "weak_scaling": "weak scaling (efficiency = T(p0)/T(P))",
    "hilbert_vs_natural": "hilbert vs natural (ratio = T(natural)/T(ordering), > 1: faster than natural)",
    "compute_communication": "compute / communication (medians over repeats of the slowest rank)",
    "peer_ratio": "PyTorch peer (ratio = T(peer)/T(case), > 1: faster than the peer)",
}

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
    transport_used: str = ""
    _stats: dict[str, tuple[float, float, float]] = field(default_factory=dict, repr=False)

    @property
    def ranks(self) -> int:
        """Number of ranks the case ran on."""
        return int(self.params["ranks"])

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
                      rel_l2_err=number(accuracy, "rel_l2_err"), transport_used=str(used))


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


def cases_table(cases: Sequence[CaseResult]) -> list[dict[str, Any]]:
    """One row per case: times (attention, and total with the copies around it), throughput, useful TFLOP/s
    and accuracy."""
    rows = []
    for c in cases:
        p = c.params
        att, tot = c.stats("attention"), c.stats("total")
        tokens = c.tokens * int(p.get("batch", 1))
        rows.append({
            "case": c.case_id, "file": c.file, "name": p["name"], "ranks": c.ranks, "tokens": c.tokens,
            "backend": p["backend"], "ordering": p["ordering"], "transport": c.transport_used or p["transport"],
            "attention_s": att[0], "attention_min_s": att[1], "attention_max_s": att[2],
            "total_s": tot[0], "total_min_s": tot[1], "total_max_s": tot[2],
            "attention_share": att[0] / tot[0] if tot[0] > 0 else math.nan,
            "tokens_per_s": tokens / tot[0] if tot[0] > 0 else math.nan,
            "tflops": c.useful_flops / att[0] / 1e12 if att[0] > 0 else math.nan,
            "max_rel_err": c.max_rel_err, "rel_l2_err": c.rel_l2_err,
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
        label = labels(_label(group[0].params, base_fields, extra))
        p0, t0 = group[0].ranks, group[0].median("attention")
        for c in group:
            t = c.median("attention")
            speedup = t0 / t if t > 0 else math.nan
            rows.append({"group": label, "case": c.case_id, "file": c.file, "ranks": c.ranks, **_timing_row(c),
                         "ideal_s": t0 * p0 / c.ranks, "speedup": speedup, "efficiency": speedup * p0 / c.ranks})
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
        label = labels(_label(s[0].params, base_fields, extra) + f" N/P={per_rank.numerator // per_rank.denominator if per_rank.denominator == 1 else float(per_rank)}")
        p0, t0 = s[0].ranks, s[0].median("attention")
        for c in s:
            t = c.median("attention")
            rows.append({"group": label, "case": c.case_id, "file": c.file, "ranks": c.ranks, "tokens": c.tokens,
                         **_timing_row(c), "ideal_s": t0, "efficiency": t0 / t if t > 0 else math.nan})
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
        label = labels(_label(natural.params, base_fields, extra))
        t_nat = natural.median("attention")
        for c in others:
            t = c.median("attention")
            rows.append({"group": label, "case": c.case_id, "file": c.file, "natural_case": natural.case_id,
                         "natural_file": natural.file, "ordering": c.params["ordering"],
                         "segment": c.params.get("segment") or 0, "natural_s": t_nat, **_timing_row(c),
                         "ratio": t_nat / t if t > 0 else math.nan})
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
        t, t_peer = c.median("attention"), peer.median("attention")
        ratio = t_peer / t if t > 0 else math.nan
        rows.append({"group": _label(c.params, base_fields, extra), "case": c.case_id, "file": c.file,
                     "backend": c.params["backend"], "ranks": c.ranks, "attention_s": t, "peer_case": peer.case_id,
                     "peer_file": peer.file, "peer_ranks": peer.ranks, "peer_s": t_peer, "ratio": ratio,
                     "ratio_per_gpu": ratio / c.ranks})
    return rows


def build_tables(cases: Sequence[CaseResult], notes: list[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Every table's rows (keys of :data:`TABLES`); notes about left-out data are appended to ``notes``."""
    return {
        "cases": cases_table(cases),
        "strong_scaling": strong_scaling_table(cases),
        "weak_scaling": weak_scaling_table(cases, notes),
        "hilbert_vs_natural": hilbert_vs_natural_table(cases),
        "compute_communication": compute_communication_table(cases),
        "peer_ratio": peer_ratio_table(cases),
    }


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


_TEXT = {"case", "file", "name", "backend", "ordering", "transport", "group", "peer case"}

#: Printed columns per table: (title, cell function of a row).
COLUMNS: dict[str, list[tuple[str, Callable[[dict], str]]]] = {
    "cases": [("case", _key_of("case")), ("file", _key_of("file")), ("name", _key_of("name")),
              ("ranks", _key_of("ranks")), ("tokens", _key_of("tokens", _fmt(","))),
              ("backend", _key_of("backend")), ("ordering", _key_of("ordering")),
              ("transport", _key_of("transport")), ("attn ms [min, max]", _range_ms("attention")),
              ("total ms", _key_of("total_s", _ms)), ("attn/total", _key_of("attention_share", _fmt(".2f"))),
              ("tokens/s", _key_of("tokens_per_s", _fmt(".3g"))), ("TFLOP/s", _key_of("tflops", _fmt(".3g"))),
              ("max rel err", _key_of("max_rel_err", _fmt(".1e")))],
    "strong_scaling": [("group", _key_of("group")), ("ranks", _key_of("ranks")),
                       ("attn ms [min, max]", _range_ms("attention")), ("ideal ms", _key_of("ideal_s", _ms)),
                       ("speedup", _key_of("speedup", _fmt(".2f"))),
                       ("efficiency", _key_of("efficiency", _fmt(".2f")))],
    "weak_scaling": [("group", _key_of("group")), ("ranks", _key_of("ranks")),
                     ("tokens", _key_of("tokens", _fmt(","))), ("attn ms [min, max]", _range_ms("attention")),
                     ("efficiency", _key_of("efficiency", _fmt(".2f")))],
    "hilbert_vs_natural": [("group", _key_of("group")),
                           ("ordering", lambda r: r["ordering"] + (f"/{r['segment']}" if r["segment"] else "")),
                           ("natural ms", _key_of("natural_s", _ms)), ("attn ms [min, max]", _range_ms("attention")),
                           ("ratio", _key_of("ratio", _fmt(".2f")))],
    "compute_communication": [("case", _key_of("case")), ("ranks", _key_of("ranks")),
                              ("transport", _key_of("transport")), ("attn ms", _key_of("attention_s", _ms)),
                              ("local ms", _key_of("local_s", _ms)), ("compute ms", _key_of("compute_s", _ms)),
                              ("wait ms", _key_of("wait_s", _ms)), ("pack ms", _key_of("pack_s", _ms)),
                              ("imbalance ms", _key_of("imbalance_s", _ms)),
                              ("wait share", _key_of("wait_share", _fmt(".1%")))],
    "peer_ratio": [("group", _key_of("group")), ("case", _key_of("case")), ("backend", _key_of("backend")),
                   ("ranks", _key_of("ranks")), ("attn ms", _key_of("attention_s", _ms)),
                   ("peer case", _key_of("peer_case")), ("peer ms", _key_of("peer_s", _ms)),
                   ("ratio", _key_of("ratio", _fmt(".2f"))), ("ratio/GPU", _key_of("ratio_per_gpu", _fmt(".2f")))],
}


def format_table(name: str, rows: Sequence[dict[str, Any]]) -> str:
    """One table as aligned plain text (title, column titles, rule, rows); text left, numbers right."""
    columns = COLUMNS[name]
    cells = [[fn(row) for _, fn in columns] for row in rows]
    widths = [max([len(title)] + [len(r[i]) for r in cells]) for i, (title, _) in enumerate(columns)]
    aligns = ["<" if title in _TEXT else ">" for title, _ in columns]

    def line(values: Sequence[str]) -> str:
        return "  ".join(f"{v:{a}{w}}" for v, a, w in zip(values, aligns, widths)).rstrip()

    out = [TABLES[name], line([t for t, _ in columns]), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out)


def print_tables(tables: dict[str, list[dict[str, Any]]], stream: TextIO | None = None) -> None:
    """Print every table that has rows, separated by blank lines (on stdout by default)."""
    stream = stream or sys.stdout
    first = True
    for name in TABLES:
        if tables.get(name):
            if not first:
                print(file=stream)
            print(format_table(name, tables[name]), file=stream)
            first = False


def _csv_value(value: Any) -> Any:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return value


def write_csv(tables: dict[str, list[dict[str, Any]]], path: str | Path) -> Path:
    """All rows of all tables in one CSV file: column ``table`` first, then the union of the rows' columns."""
    columns: dict[str, None] = {"table": None}
    for name in TABLES:
        for row in tables.get(name, []):
            columns.update(dict.fromkeys(row))
    path = Path(path)
    try:
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(columns), restval="")
            writer.writeheader()
            for name in TABLES:
                for row in tables.get(name, []):
                    writer.writerow({"table": name, **{k: _csv_value(v) for k, v in row.items()}})
    except OSError as exc:
        raise UserError(f"cannot write {str(path)!r}: {exc.strerror or exc}", "--csv") from None
    return path


def _series(rows: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(row["group"], []).append(row)
    return out


def _scaling_figure(rows: Sequence[dict[str, Any]], title: str, efficiency_title: str, log_time: bool) -> Any:
    """Two panels: time (with the ideal, dashed) and efficiency (with 1.0) against ranks on a log2 axis."""
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


def write_plots(tables: dict[str, list[dict[str, Any]]], plot_dir: str | Path) -> list[str]:
    """``strong_scaling.png`` and ``weak_scaling.png`` in ``plot_dir`` for the tables that have rows."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError("plots need matplotlib: install the 'plot' extra (pip install 'hilbert_hpc[plot]')",
                        "--plot") from None
    directory = Path(plot_dir)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create {str(directory)!r}: {exc.strerror or exc}", "--plot") from None
    written = []
    for name, title, eff_title, log_time in (
            ("strong_scaling", "strong scaling", "efficiency = T(p0) p0 / (T(P) P)", True),
            ("weak_scaling", "weak scaling (ideal: flat)", "efficiency = T(p0) / T(P)", False)):
        rows = tables.get(name)
        if not rows:
            continue
        path = directory / f"{name}.png"
        fig = _scaling_figure(rows, title, eff_title, log_time)
        try:
            fig.savefig(path, dpi=120)
        except OSError as exc:
            raise UserError(f"cannot write {str(path)!r}: {exc.strerror or exc}", "--plot") from None
        written.append(str(path))
    return written


def report(paths: Sequence[str | Path], stream: TextIO | None = None, csv_path: str | Path | None = None,
           plot_dir: str | Path | None = None) -> dict[str, list[Any]]:
    """Print the tables; write CSV / PNG plots when asked; return the table rows (for tests).

    The result maps each table name of :data:`TABLES` to its rows (dicts,
    times in seconds), ``"notes"`` to the note lines printed and ``"plots"``
    to the PNG files written.
    """
    stream = stream or sys.stdout
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    cases, notes = load_cases(paths)
    tables: dict[str, list[Any]] = build_tables(cases, notes)
    files = len({str(p) for p in paths})
    print(f"hilbert-hpc report: {len(cases)} case(s) from {files} file(s)", file=stream)
    for note in notes:
        print(f"note: {note}", file=stream)
    print(file=stream)
    print_tables(tables, stream)
    if csv_path is not None:
        write_csv(tables, csv_path)
        print(f"\ncsv -> {csv_path}", file=stream)
    plots = write_plots(tables, plot_dir) if plot_dir is not None else []
    for path in plots:
        print(f"plot -> {path}", file=stream)
    tables["notes"] = notes
    tables["plots"] = plots
    return tables
