"""Regression checks of results files: figures of merit, per-system references, and their verdicts.

The figures of merit of a case (:func:`figures_of_merit`) are read from the report's tables, so they are the
numbers ``report`` prints: the median attention time (and, forward+backward, the backward's and the
sum's) with its range over the repeats, useful TFLOP/s, the largest relative error, and, for a case of a
scaling series, its speedup and efficiency. A references file (TOML, :func:`read_references`) holds, per
system and case, ``figure = [value, lower, upper, "unit"]`` in ReFrame's form: ``lower`` and ``upper`` are
fractions of ``value`` (``-0.1``: 10 % below; ``false``: no bound on that side). :func:`check` compares each
measured figure with its reference: ``pass``, ``fail``, and, when the median passes but the repeats' range
crosses a threshold (or the other way round), ``straddles`` in the note. ``report --check`` prints the
verdicts and exits non-zero on a failure; ``report --save-references`` writes a references file from a
results file to start from (:func:`references_text`).
"""

from __future__ import annotations

import math
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from hilbert_hpc.errors import UserError

try:
    import tomllib
except ModuleNotFoundError:          # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

#: the figures of merit, each a column of the report's tables: (name, unit, the columns of its range over the
#: repeats, or None)
FIGURES: tuple[tuple[str, str, tuple[str, str] | None], ...] = (
    ("attention_s", "s", ("attention_min_s", "attention_max_s")),
    ("backward_s", "s", ("backward_min_s", "backward_max_s")),
    ("forward_backward_s", "s", ("forward_backward_min_s", "forward_backward_max_s")),
    ("tflops", "TFLOP/s", None),
    ("max_rel_err", "1", None),
    ("grad_max_rel_err", "1", None),
    ("speedup", "1", ("speedup_min", "speedup_max")),
    ("efficiency", "1", ("efficiency_min", "efficiency_max")),
)
#: default tolerances of a saved reference (fractions of the value): times and rates 10 %, errors up to 10x
#: (an error is a bound, not a target), speedup and efficiency 10 % below
DEFAULT_BOUNDS = {"s": (-0.1, 0.1), "TFLOP/s": (-0.1, 0.1), "1": (-0.1, None)}
ERROR_BOUNDS = (None, 9.0)
#: how a references file that report wrote begins (its first line)
REFERENCES_MARK = "# hilbert-hpc references"
#: the environment variable naming the system (else the host name)
SYSTEM_VARIABLE = "HILBERT_HPC_SYSTEM"


@dataclass(frozen=True)
class Figure:
    """One measured figure of merit of a case: its median ``value`` and the range over the repeats
    (``low``, ``high``; the value itself where the figure has no spread)."""

    case: str
    name: str
    figure: str
    value: float
    low: float
    high: float
    unit: str


@dataclass(frozen=True)
class Reference:
    """A reference ``(value, lower, upper, unit)``: the bounds are fractions of ``value`` (None: unbounded)."""

    value: float
    lower: float | None
    upper: float | None
    unit: str

    def bounds(self) -> tuple[float, float]:
        """(lowest, highest) accepted value."""
        lo = -math.inf if self.lower is None else self.value * (1 + self.lower)
        hi = math.inf if self.upper is None else self.value * (1 + self.upper)
        return lo, hi


@dataclass(frozen=True)
class Verdict:
    """A figure against its reference: ``result`` pass or fail, and a ``note`` where the repeats straddle a
    threshold."""

    figure: Figure
    reference: Reference
    result: str
    note: str


def system_name(given: str | None = None) -> str:
    """The system a run is checked as: ``given``, else $HILBERT_HPC_SYSTEM, else the host name."""
    return given or os.environ.get(SYSTEM_VARIABLE) or socket.gethostname()


def figures_of_merit(tables: dict[str, list[dict[str, Any]]]) -> list[Figure]:
    """Every figure of merit of every case of a report's ``tables`` (``report_tables.build_tables``): those of
    its row of the cases table, then its speedup / efficiency from the strong or weak scaling table (not for
    the base case of a series)."""
    rows: dict[str, dict[str, Any]] = {}
    for row in tables.get("cases", []):
        rows[row["case"]] = dict(row)
    for table in ("strong_scaling", "weak_scaling"):
        for row in tables.get(table, []):
            if row["case"] in rows and row.get("noise"):
                scaling = {k: row[k] for k in row if k.startswith(("speedup", "efficiency"))}
                if "speedup_min" in scaling and "efficiency_min" not in scaling and scaling.get("speedup"):
                    per_rank = scaling["efficiency"] / scaling["speedup"]       # strong scaling: p0 / P
                    scaling.update(efficiency_min=scaling["speedup_min"] * per_rank,
                                   efficiency_max=scaling["speedup_max"] * per_rank)
                rows[row["case"]].update(scaling)
    out = []
    for case, row in rows.items():
        for name, unit, spread in FIGURES:
            value = row.get(name)
            if value is None or not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            if name == "tflops":      # the rate of the median time; its range from the times' range
                low, high = _rate_range(value, row["attention_s"], row["attention_min_s"], row["attention_max_s"])
            elif spread is not None:
                low, high = float(row.get(spread[0], value)), float(row.get(spread[1], value))
            else:
                low = high = float(value)
            out.append(Figure(case, str(row.get("name", "")), name, float(value), low, high, unit))
    return out


def _rate_range(rate: float, median: float, fastest: float, slowest: float) -> tuple[float, float]:
    """The range of a rate measured at ``median`` over repeats from ``fastest`` to ``slowest``."""
    if not (fastest > 0 and slowest > 0):
        return rate, rate
    return rate * median / slowest, rate * median / fastest


def check(figures: Sequence[Figure], references: dict[str, dict[str, Reference]]) -> list[Verdict]:
    """The verdict of every figure that has a reference (``references[case][figure]``)."""
    out = []
    for f in figures:
        ref = references.get(f.case, {}).get(f.figure)
        if ref is None:
            continue
        lo, hi = ref.bounds()
        inside = lo <= f.value <= hi
        spread_inside = lo <= f.low and f.high <= hi
        spread_outside = f.high < lo or f.low > hi
        note = ""
        if inside and not spread_inside:
            note = "the repeats straddle a threshold"
        elif not inside and not spread_outside:
            note = "the repeats straddle a threshold: some repeats pass"
        out.append(Verdict(f, ref, "pass" if inside else "fail", note))
    return out


def _bound(value: Any, where: str) -> float | None:
    if value is False or value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"{where}: a threshold must be a number (a fraction of the value) or false, got {value!r}",
                        "--check")
    return float(value)


def read_references(path: str | Path, system: str) -> dict[str, dict[str, Reference]]:
    """The references of ``system`` in the TOML file ``path`` (``[references."SYSTEM"."CASE"]``, falling back
    on system ``"*"``): ``{case: {figure: Reference}}``; a UserError names what is wrong with the file."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"references file {str(path)!r} does not exist", "--check") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read references file {str(path)!r}: {exc}", "--check") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"references file {str(path)!r} is not valid TOML: {exc}", "--check") from None
    systems = doc.get("references")
    if not isinstance(systems, dict):
        raise UserError(f"references file {str(path)!r} has no [references.\"SYSTEM\".\"CASE\"] tables", "--check")
    chosen = systems.get(system, systems.get("*"))
    if chosen is None:
        raise UserError(f"references file {str(path)!r} has no references for system {system!r} (nor for \"*\"); "
                        f"it has {', '.join(map(repr, systems)) or 'none'}: choose one with --system", "--check")
    out: dict[str, dict[str, Reference]] = {}
    names = {n for n, *_ in FIGURES}
    for case, figures in chosen.items():
        if not isinstance(figures, dict):
            raise UserError(f"{path}: references.{system}.{case} must be a table of figures", "--check")
        out[case] = {}
        for figure, entry in figures.items():
            where = f"{path}: references.{system}.{case}.{figure}"
            if figure == "name":
                continue
            if figure not in names:
                raise UserError(f"{where}: unknown figure (one of {', '.join(sorted(names))})", "--check")
            if not isinstance(entry, list) or len(entry) != 4 or not isinstance(entry[3], str):
                raise UserError(f"{where}: a reference is [value, lower, upper, \"unit\"]", "--check")
            value = _bound(entry[0], where)
            if value is None:
                raise UserError(f"{where}: the reference value must be a number", "--check")
            out[case][figure] = Reference(value, _bound(entry[1], where), _bound(entry[2], where), entry[3])
    return out


def references_text(figures: Sequence[Figure], system: str) -> str:
    """A references file holding each figure as measured, with the default tolerances (:data:`DEFAULT_BOUNDS`;
    errors: :data:`ERROR_BOUNDS`), for system ``system``: the start of a file to edit."""
    def toml(x: float | None) -> str:
        return "false" if x is None else repr(float(x))

    lines = [f"{REFERENCES_MARK}: figure = [value, lower, upper, \"unit\"], lower and upper as fractions of",
             "# the value (ReFrame's form; false: no bound). Written by `hilbert-hpc report --save-references`.",
             ""]
    by_case: dict[str, list[Figure]] = {}
    for f in figures:
        by_case.setdefault(f.case, []).append(f)
    for case, figs in by_case.items():
        lines.append(f"[references.{_key(system)}.{_key(case)}]")
        lines.append(f"name = {_quoted(figs[0].name)}")
        for f in figs:
            lower, upper = ERROR_BOUNDS if f.figure.endswith("rel_err") else DEFAULT_BOUNDS[f.unit]
            lines.append(f"{f.figure} = [{f.value!r}, {toml(lower)}, {toml(upper)}, {_quoted(f.unit)}]")
        lines.append("")
    return "\n".join(lines)


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _key(text: str) -> str:
    return text if text.replace("-", "").replace("_", "").isalnum() else _quoted(text)


def verdict_lines(verdicts: Sequence[Verdict], system: str) -> list[str]:
    """The printed check: one line per figure (case, figure, measured [range], reference [bounds], verdict)."""
    lines = [f"regression check against the references of system {system!r}:"]
    for v in verdicts:
        f, lo_hi = v.figure, v.reference.bounds()
        lines.append(f"  {f.case} {f.name:<20} {f.figure:<19} {f.value:.4g} [{f.low:.4g}, {f.high:.4g}] {f.unit}; "
                     f"reference {v.reference.value:.4g} [{lo_hi[0]:.4g}, {lo_hi[1]:.4g}]: {v.result.upper()}"
                     f"{'; ' + v.note if v.note else ''}")
    failed = sum(v.result == "fail" for v in verdicts)
    lines.append(f"{len(verdicts)} figure(s) checked: {len(verdicts) - failed} passed, {failed} failed")
    return lines
