"""The tables of a report: rows (dicts, times in seconds) built from the pooled cases, and their notes.

Every ratio comes with its range over the repeats and a verdict (:func:`compare`).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from fractions import Fraction
from typing import Any, Iterable, Sequence

from hilbert_hpc.study import record as rec
from hilbert_hpc.core.patterns import BACKWARD_FLOPS, Pattern
from hilbert_hpc.core.work import rank_useful_flops
from hilbert_hpc.distributed.sharding import Shards
from hilbert_hpc.study.report_read import FORWARD_BACKWARD, BandwidthSweep, CaseResult, is_true, params_key


#: Table keys of the dictionary returned by :func:`report`, in print order, with their titles.
TABLES = {
    "cases": "cases (times: median over repeats of the slowest rank [min, max]; spread = max/min)",
    "strong_scaling": "strong scaling (speedup = T(p0)/T(P), efficiency = speedup * p0/P)",
    "weak_scaling": "weak scaling (efficiency = T(p0)/T(P))",
    "hilbert_vs_natural": "hilbert vs natural (ratio = T(natural)/T(ordering), > 1: faster than natural)",
    "compute_communication": "compute / communication (medians over repeats of the slowest rank)",
    "imbalance": "load imbalance (largest / mean across ranks, 1: balanced; times: median over repeats)",
    "peer_ratio": "peers: torch, flash (ratio = T(peer)/T(case), > 1: faster than the peer)",
    "bandwidth": "bandwidth (ring exchange, GB/s per rank: bytes sent / time of the slowest rank)",
    "accuracy_ranks": "accuracy against ranks (max |err| / max |ref| vs float64; growth = err(P) / err(fewest ranks))",
}


#: Short table names for notes.
TITLES = {"cases": "cases", "strong_scaling": "strong scaling", "weak_scaling": "weak scaling",
          "hilbert_vs_natural": "hilbert vs natural", "compute_communication": "compute / communication",
          "imbalance": "load imbalance", "peer_ratio": "peers", "bandwidth": "bandwidth",
          "accuracy_ranks": "accuracy against ranks"}


#: A case whose slowest repeat took more than this many times its fastest gets a note (and ``!``).
SPREAD_LIMIT = 2.0


#: A scaling efficiency above this is superlinear beyond plausibility: a note (and ``!``).
EFFICIENCY_LIMIT = 1.1


#: Fewest repeats per case for a ratio's noise verdict (one repeat has no spread).
MIN_REPEATS = 2


#: Cases named at most in one note.
NOTE_CASES = 6


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
        groups.setdefault(params_key(case.params, drop), []).append(case)
    return list(groups.values())


#: The backward's timings of a forward+backward case, each with the prefix of its columns: the backward, and the
#: forward and backward together (their sum per rank and repeat).
BACKWARD_TIMINGS = (("backward", "backward"), ("forward_backward", FORWARD_BACKWARD))


def _timing_row(case: CaseResult, prefix: str = "attention", timing: str = "attention") -> dict[str, float]:
    """``timing``'s median, min and max over repeats (slowest rank) as ``{prefix}_s``, ``_min_s``, ``_max_s``."""
    med, lo, hi = case.stats(timing)
    return {f"{prefix}_s": med, f"{prefix}_min_s": lo, f"{prefix}_max_s": hi}


def compare(reference: CaseResult, case: CaseResult, timing: str = "attention") -> dict[str, Any]:
    """``T(reference) / T(case)`` on medians of ``timing`` (default the forward), its range over the repeats, and
    whether that range holds 1.

    The rule for every comparison of the report (docs/studies.md): with
    ``[lo, hi]`` the minimum and maximum over repeats of each case's time
    (slowest rank), ``ratio_min = lo_ref / hi_case`` and
    ``ratio_max = hi_ref / lo_case``. When ``ratio_min <= 1 <= ratio_max`` the
    two ranges overlap: the repeats do not show that the two cases differ, and
    ``noise`` is ``"within noise"``; otherwise ``"resolved"``. A case with
    fewer than :data:`MIN_REPEATS` repeats has no spread to judge by
    (``"too few repeats"``).
    """
    t_ref, lo_ref, hi_ref = reference.stats(timing)
    t, lo, hi = case.stats(timing)
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
    used = [c.transport for c in cases]
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
            "backend": p["backend"], "dtype": p.get("dtype", ""), "causal": is_true(p.get("causal")),
            "ordering": p["ordering"], "transport": c.transport,
            "attention_s": att[0], "attention_min_s": att[1], "attention_max_s": att[2],
            "total_s": tot[0], "total_min_s": tot[1], "total_max_s": tot[2],
            "attention_share": att[0] / tot[0] if tot[0] > 0 else math.nan,
            "tokens_per_s": tokens / tot[0] if tot[0] > 0 else math.nan,
            "tflops": c.metrics.useful_flops / att[0] / 1e12 if att[0] > 0 else math.nan,
            **rec.columns(c.setup, c.bookkeeping, c.metrics, c.accuracy),
            "repeats": c.repeats, "spread": att[2] / att[1] if att[1] > 0 else math.nan,
            **(_backward_columns(c) if c.backward else {}),
        })
    return rows


def _backward_columns(c: CaseResult) -> dict[str, Any]:
    """A forward+backward case's backward and forward+backward times [min, max], their useful TFLOP/s
    (``BACKWARD_FLOPS`` and 1 + ``BACKWARD_FLOPS`` times the forward's useful FLOPs) and its largest gradient
    error (forward cases have none of these columns)."""
    row: dict[str, Any] = {}
    for (prefix, timing), flops in zip(BACKWARD_TIMINGS, (BACKWARD_FLOPS, 1 + BACKWARD_FLOPS)):
        row.update(_timing_row(c, prefix, timing))
        med = row[f"{prefix}_s"]
        row[f"{prefix}_tflops"] = flops * c.metrics.useful_flops / med / 1e12 if med > 0 else math.nan
    row["grad_max_rel_err"] = c.accuracy.grad_max_rel_err
    return row


def _scaling_columns(base: CaseResult, c: CaseResult, strong: bool, timing: str = "attention",
                     prefix: str = "") -> dict[str, Any]:
    """``c`` against the base case of its scaling series on ``timing`` (:func:`compare`): the ideal time, and
    for strong scaling the speedup T(p0)/T(P) with its range and the efficiency speedup * p0/P, for weak
    scaling the efficiency T(p0)/T(P) with its range; then the noise verdict ("" for the base itself). Keys
    start with ``prefix``."""
    vs = compare(base, c, timing)
    t0 = base.median(timing)
    if strong:
        p0, p = base.ranks, c.ranks
        row = {"ideal_s": t0 * p0 / p, "speedup": vs["ratio"], "efficiency": vs["ratio"] * p0 / p,
               "speedup_min": vs["ratio_min"], "speedup_max": vs["ratio_max"]}
    else:
        row = {"ideal_s": t0, "efficiency": vs["ratio"], "efficiency_min": vs["ratio_min"],
               "efficiency_max": vs["ratio_max"]}
    row["noise"] = "" if c is base else vs["noise"]
    return {f"{prefix}{key}": value for key, value in row.items()}


def _backward_scaling(series: Sequence[CaseResult], c: CaseResult, strong: bool) -> dict[str, Any]:
    """The backward's and forward+backward's times [min, max] and :func:`_scaling_columns` of a case of a
    series that all ran the backward (keys ``backward_...``, ``forward_backward_...``); nothing otherwise."""
    if not all(s.backward for s in series):
        return {}
    row: dict[str, Any] = {}
    for prefix, timing in BACKWARD_TIMINGS:
        row.update(_timing_row(c, prefix, timing))
        row.update(_scaling_columns(series[0], c, strong, timing, f"{prefix}_"))
    return row


def _rank_series(cases: Sequence[CaseResult], base_fields: Sequence[str]) -> list[tuple[str, list[CaseResult]]]:
    """Groups of ``cases`` equal except ``ranks`` with at least two rank counts, each sorted by ranks, with its
    label (``base_fields``, then the other parameters that vary among the groups)."""
    groups = [sorted(g, key=lambda c: c.ranks) for g in _groups(cases, ["ranks"]) if len({c.ranks for c in g}) > 1]
    extra = _varying([c for g in groups for c in g], ["ranks", "scaling", *base_fields])
    labels = _Labels()
    return [(labels(_group_label(g, base_fields, extra)), g) for g in groups]


def strong_scaling_table(cases: Sequence[CaseResult]) -> list[dict[str, Any]]:
    """Strong scaling: groups equal except ``ranks`` with at least two rank counts, against the fewest ranks;
    for a group of forward+backward cases also the backward's and forward+backward's."""
    series = _rank_series([c for c in cases if c.params["scaling"] == "strong"],
                          ["name", "backend", "ordering", "transport", "tokens"])
    return [{"group": label, "case": c.case_id, "file": c.file, "ranks": c.ranks, **_timing_row(c),
             **_scaling_columns(group[0], c, strong=True), **_backward_scaling(group, c, strong=True)}
            for label, group in series for c in group]


def weak_scaling_table(cases: Sequence[CaseResult], notes: list[str] | None = None) -> list[dict[str, Any]]:
    """Weak scaling: groups equal except ranks, tokens, grid and patterns, against the fewest ranks; for a
    series of forward+backward cases also the backward's and forward+backward's.

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
        for c in s:
            rows.append({"group": label, "case": c.case_id, "file": c.file, "ranks": c.ranks, "tokens": c.tokens,
                         **_timing_row(c), **_scaling_columns(s[0], c, strong=False),
                         **_backward_scaling(s, c, strong=False)})
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
    """Ring counters of the cases on more than one rank, and the share of waiting in the attention time; for a
    forward+backward case whose file records them, the backward ring's counters (``backward_local_s``, ...)
    and the share of waiting in the backward time."""
    rows = []
    for c in cases:
        if c.ranks <= 1:
            continue
        att = c.median("attention")
        row: dict[str, Any] = {"case": c.case_id, "file": c.file, "name": c.params["name"], "ranks": c.ranks,
                               "backend": c.params["backend"], "transport": c.transport,
                               "attention_s": att}
        row.update({name: c.median(name) for name in rec.RING_TIMES})
        row["wait_share"] = row["wait_s"] / att if att > 0 else math.nan
        local_flops, long_flops = split_flops(c)
        row["long_overhead"] = long_overhead(att, row["local_s"], row["imbalance_s"], local_flops, long_flops)
        row["hop_s"] = hop_seconds(c, "")
        if c.backward and all(name in c.timings for name in rec.RING_BACKWARD_TIMES):
            bwd = c.median("backward")
            row["backward_s"] = bwd
            row.update({name: c.median(name) for name in rec.RING_BACKWARD_TIMES})
            row["backward_wait_share"] = row["backward_wait_s"] / bwd if bwd > 0 else math.nan
            row["backward_long_overhead"] = long_overhead(bwd, row["backward_local_s"], row["backward_imbalance_s"],
                                                          local_flops, long_flops)
            row["backward_hop_s"] = hop_seconds(c, "backward_")
        rows.append(row)
    return rows


def hop_seconds(c: CaseResult, prefix: str) -> float:
    """The time of one hop of a rotating ring, ``(compute_s + wait_s) / ring_steps`` of a pass (``prefix``:
    "" or "backward_"), for a case whose long patterns all rotate (a gathered one's work is not a hop); NaN
    otherwise and for files that do not count the hops."""
    steps = f"{prefix}ring_steps"
    if steps not in c.timings or "gather" in (c.setup.long_schedules or ""):
        return math.nan
    hops = c.median(steps)
    return (c.median(f"{prefix}compute_s") + c.median(f"{prefix}wait_s")) / hops if hops > 0 else math.nan


def split_flops(c: CaseResult) -> tuple[float, float]:
    """Useful forward FLOPs of the local patterns and of the long ones (spanning ranks) of the rank with the most
    useful FLOPs of case ``c``."""
    patterns = [Pattern(int(w), int(r)) for w, r in c.params["patterns"]]
    chunk = Shards(c.tokens, c.ranks, c.placement).chunk
    args = (c.tokens, c.ranks, int(c.params["heads"]), int(c.params["head_dim"]))
    rest = (is_true(c.params.get("causal")), int(c.params.get("batch", 1)), c.placement)
    local = rank_useful_flops(*args, [p for p in patterns if p.segment <= chunk], *rest)
    long = rank_useful_flops(*args, [p for p in patterns if p.segment > chunk], *rest)
    busiest = max(range(c.ranks), key=lambda i: local[i] + long[i])
    return float(local[busiest]), float(long[busiest])


def long_overhead(total_s: float, local_s: float, imbalance_s: float, local_flops: float,
                  long_flops: float) -> float:
    """The long patterns' overhead, a share of ``total_s`` (a pass's time): the time beyond the local patterns
    and the wait for slower ranks, less the long patterns' useful FLOPs at the local patterns' rate (the same
    for the backward, whose FLOPs are both ``BACKWARD_FLOPS`` times the forward's); NaN without local work."""
    if not (total_s > 0 and local_s > 0 and local_flops > 0):
        return math.nan
    useful_s = long_flops * local_s / local_flops
    return (total_s - local_s - imbalance_s - useful_s) / total_s


def imbalance_table(cases: Sequence[CaseResult]) -> list[dict[str, Any]]:
    """Load imbalance (largest / mean across ranks; 1: balanced) of the cases on more than one rank, with the
    placement they used: of the useful FLOPs of the queries each rank owns, of the attention time and, for a forward+backward case, of the
    backward time (medians over repeats)."""
    rows = []
    for c in cases:
        if c.ranks <= 1:
            continue
        row: dict[str, Any] = {"case": c.case_id, "file": c.file, "name": c.params["name"], "ranks": c.ranks,
                               "causal": is_true(c.params.get("causal")), "placement": c.placement,
                               "flops_imbalance": c.imbalance("useful_flops"),
                               "attention_imbalance": c.imbalance("attention")}
        if c.backward:
            row["backward_imbalance"] = c.imbalance("backward")
        rows.append(row)
    return rows


#: the peers, in the order their rows follow a case: the PyTorch peer, the FlashAttention-4 peer
PEER_BACKENDS = ("torch", "flash")


def peer_ratio_table(cases: Sequence[CaseResult]) -> list[dict[str, Any]]:
    """Each case of our backends against each peer (:data:`PEER_BACKENDS`: the PyTorch peer, then the
    FlashAttention-4 peer) run with equal parameters except backend, transport, ranks, scaling.

    Among several runs of one peer the one on one rank is preferred, then the
    fewest ranks, then the later one loaded.
    """
    free = ["backend", "transport", "ranks", "scaling"]
    peers: dict[tuple[str, str], list[tuple[int, CaseResult]]] = defaultdict(list)
    for i, c in enumerate(cases):
        if c.params["backend"] in PEER_BACKENDS:
            peers[(c.params["backend"], params_key(c.params, free))].append((i, c))
    pairs = []
    for c in cases:
        if c.params["backend"] in PEER_BACKENDS:
            continue
        for name in PEER_BACKENDS:
            found = peers.get((name, params_key(c.params, free)))
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
                     "peer_backend": peer.params["backend"],
                     "peer_s": peer.median("attention"), **vs, "ratio_per_gpu": vs["ratio"] / c.ranks,
                     **(_peer_backward(peer, c) if c.backward and peer.backward else {})})
    return rows


def _peer_backward(peer: CaseResult, c: CaseResult) -> dict[str, Any]:
    """The backward and the forward+backward of a case against its peer, as the forward's columns are:
    times, ratio T(peer) / T(case) with its range and verdict (:func:`compare`)."""
    row: dict[str, Any] = {}
    for prefix, timing in BACKWARD_TIMINGS:
        vs = compare(peer, c, timing)
        row.update({f"{prefix}_s": c.median(timing), f"peer_{prefix}_s": peer.median(timing),
                    **{f"{prefix}_{key}": value for key, value in vs.items()}})
    return row


def _growth(error: float, base: float) -> float:
    """``error / base``: 1 where both are zero, NaN where only the base is (or either is NaN)."""
    return 1.0 if error == base == 0.0 else (error / base if base > 0 else math.nan)


def accuracy_ranks_table(cases: Sequence[CaseResult]) -> list[dict[str, Any]]:
    """Groups equal except ``ranks`` (two rank counts or more, every case checked against float64): each case's
    output and (forward+backward) gradient errors, and their growth against the group's fewest ranks."""
    rows = []
    for label, group in _rank_series([c for c in cases if math.isfinite(c.accuracy.max_rel_err)],
                                     ["name", "backend", "dtype", "ordering", "transport", "tokens"]):
        base = group[0].accuracy
        for c in group:
            acc = c.accuracy
            row = {"group": label, "case": c.case_id, "file": c.file, "ranks": c.ranks,
                   "max_rel_err": acc.max_rel_err, "growth": _growth(acc.max_rel_err, base.max_rel_err)}
            if all(s.backward for s in group):
                row.update({f"grad_{x}_max_rel_err": getattr(acc, f"grad_{x}_max_rel_err") for x in "qkv"},
                           grad_max_rel_err=acc.grad_max_rel_err, grad_growth=_growth(acc.grad_max_rel_err,
                                                                                      base.grad_max_rel_err))
            rows.append(row)
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
        "imbalance": imbalance_table(cases),
        "peer_ratio": peer_ratio_table(cases),
        "bandwidth": bandwidth_table(sweeps),
        "accuracy_ranks": accuracy_ranks_table(cases),
    }


def table_notes(name: str, rows: Sequence[dict[str, Any]]) -> list[str]:
    """Warnings about a table's rows: repeats spread beyond :data:`SPREAD_LIMIT`, efficiency beyond
    :data:`EFFICIENCY_LIMIT`, and the ratios that are within the repeats' spread (:func:`compare`)."""
    notes = []
    for row in rows:
        if name == "cases" and row["spread"] > SPREAD_LIMIT:
            notes.append(f"case {row['case']}: repeats spread {row['spread']:.3g}x (slowest / fastest, limit "
                         f"{SPREAD_LIMIT:g}x): its median is not a steady figure; rerun with more repeats")
        for key, what in (("efficiency", ""), ("backward_efficiency", "backward "),
                          ("forward_backward_efficiency", "forward+backward ")):
            if name in ("strong_scaling", "weak_scaling") and row.get(key, 0.0) > EFFICIENCY_LIMIT:
                notes.append(f"{TITLES[name]} {row['group']} P={row['ranks']}: {what}efficiency {row[key]:.3g} is "
                             f"implausibly superlinear (> {EFFICIENCY_LIMIT:g}); check the cases' spread")
    for key, what in (("noise", ""), ("backward_noise", "backward "), ("forward_backward_noise",
                                                                     "forward+backward ")):
        for verdict, meaning in (("within noise", "the two cases' [min, max] times over repeats overlap"),
                                 ("too few repeats", f"fewer than {MIN_REPEATS} repeats: no spread to judge by")):
            marked = [row for row in rows if row.get(key) == verdict]
            if marked:
                compared = sum(1 for row in rows if row.get(key))
                cases = ", ".join(row["case"] for row in marked[:NOTE_CASES]) + (", ..." if len(marked) > NOTE_CASES
                                                                                 else "")
                notes.append(f"{TITLES[name]}: {len(marked)} of {compared} {what}ratio(s) {verdict} ({cases}): "
                             f"{meaning}")
    return notes
