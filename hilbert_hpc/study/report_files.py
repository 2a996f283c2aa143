"""The files a report writes: all rows as one CSV file, the scaling curves and the errors against ranks as PNG
plots, and how a report recognizes its own earlier files (the only ones it may replace)."""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path
from typing import Any, Callable, Sequence, TextIO

import numpy as np

from hilbert_hpc.errors import UserError
from hilbert_hpc.study.report_tables import TABLES


#: ``Software`` text of the PNG files report writes: how a report recognizes its own plots.
PNG_SOFTWARE = "hilbert-hpc report"


#: A CSV file larger than this is not taken for a report's (not read to find out).
MAX_OWN_CSV_BYTES = 64 << 20


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


#: The curves of a scaling plot: the row key prefix of the times (``{prefix}_s``, ``_min_s``, ``_max_s``,
#: ``_ideal_s``) and of the efficiency, the name of what they time, and their marker. A series has the
#: backward's and forward+backward's only when its rows have them (forward+backward cases).
CURVES = (("attention", "", "forward", "o"), ("backward", "backward_", "backward", "s"),
          ("forward_backward", "forward_backward_", "forward+backward", "^"))


def scaling_figure(rows: Sequence[dict[str, Any]], title: str, efficiency_title: str, log_time: bool) -> Any:
    """Time (with the ideal) and efficiency (with 1.0) against ranks on a log2 axis, one series per group in
    its color: two panels side by side. With forward+backward cases, one such row of panels per pass
    (:data:`CURVES`: forward, backward, forward+backward, each titled by it), so no panel holds more than one
    curve and one ideal per group; a forward-only group appears in the forward row alone. Measured curves are
    solid with markers and error bars (the repeats' range), ideals dashed, thinner and without markers. One
    legend below the panels names each group by its color (with the transport it used): it grows with the
    groups and never covers a curve."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    groups = _series(rows)
    any_backward = any("backward_s" in r for r in rows)
    kinds = [c for c in CURVES if any(f"{c[0]}_s" in r for r in rows)] if any_backward else list(CURVES[:1])
    columns = 1 if max((len(label) for label in groups), default=0) > 60 else 2   # long labels: one column
    panel_h = 4.0 if len(kinds) == 1 else 3.2
    fig = Figure(figsize=(11, panel_h * len(kinds) + 0.5 + 0.22 * math.ceil(len(groups) / columns)),
                 layout="constrained")
    FigureCanvasAgg(fig)
    panels = fig.subplots(len(kinds), 2, squeeze=False)
    ticks = sorted({r["ranks"] for r in rows})
    what = "time" if any_backward else "attention time"
    for (time_key, eff_prefix, kind, marker), (ax_t, ax_e) in zip(kinds, panels):
        efficiencies = _draw_kind(ax_t, ax_e, groups, time_key, eff_prefix, marker)
        for ax in (ax_t, ax_e):
            _rank_axis(ax, ticks)
        if log_time:
            ax_t.set_yscale("log")
        else:
            ax_t.set_ylim(bottom=0)
        suffix = f": {kind}" if any_backward else ""
        ax_t.set_ylabel(f"{what}, s (slowest rank, median; dashed: ideal)")
        ax_t.set_title(f"{title}{suffix}")
        ax_e.axhline(1.0, color="black", linewidth=1, linestyle=":")
        top = max([1.0] + [e for e in efficiencies if math.isfinite(e)])
        ax_e.set_ylim(0, 1.1 * top)
        ax_e.set_ylabel("efficiency")
        ax_e.set_title(f"{efficiency_title}{suffix}")
    fig.legend(handles=_group_handles(groups), loc="outside lower center", ncols=columns, fontsize="small")
    return fig


def _rank_axis(ax: Any, ticks: Sequence[int]) -> None:
    """A ranks axis: log2 scale with a tick at each rank count, labelled, with a light grid."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("ranks")
    ax.grid(True, alpha=0.3)


def _group_handles(groups: dict[str, Any]) -> list[Any]:
    """Legend entries naming each group by its color (``C<i>``, the order the curves were drawn in)."""
    from matplotlib.lines import Line2D

    return [Line2D([], [], color=f"C{i % 10}", linewidth=3, label=label) for i, label in enumerate(groups)]


def _draw_kind(ax_t: Any, ax_e: Any, groups: dict[str, list[dict[str, Any]]], time_key: str, eff_prefix: str,
               marker: str) -> list[float]:
    """One pass's curves: every group that has them, its time with the repeats' range and its ideal (labelled
    ``<group> (ideal)``) on ``ax_t``, its efficiency on ``ax_e``; returns the efficiencies drawn."""
    efficiencies: list[float] = []
    for i, (label, series) in enumerate(groups.items()):
        if f"{time_key}_s" not in series[0]:
            continue
        color = f"C{i % 10}"
        ranks = [r["ranks"] for r in series]
        med = np.array([r[f"{time_key}_s"] for r in series])
        err = np.array([med - [r[f"{time_key}_min_s"] for r in series],
                        [r[f"{time_key}_max_s"] for r in series] - med])
        eff = [r[f"{eff_prefix}efficiency"] for r in series]
        efficiencies += eff
        ax_t.errorbar(ranks, med, yerr=err, marker=marker, linestyle="-", color=color, capsize=3, label=label)
        ax_t.plot(ranks, [r[f"{eff_prefix}ideal_s"] for r in series], linestyle="--", linewidth=1, color=color,
                  alpha=0.6, label=f"{label} (ideal)")
        ax_e.plot(ranks, eff, marker=marker, linestyle="-", color=color, label=label)
    return efficiencies


def accuracy_figure(rows: Sequence[dict[str, Any]]) -> Any:
    """The accuracy-against-ranks table as curves: max |err| / max |ref| against float64 (log axis) against
    ranks (log2 axis), one color per group, the output's error solid with circles and, for forward+backward
    groups, the largest gradient error dashed with squares; one legend below the panel names the groups."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    groups = _series(rows)
    columns = 1 if max((len(label) for label in groups), default=0) > 60 else 2
    fig = Figure(figsize=(9, 4.5 + 0.22 * math.ceil((len(groups) + 2) / columns)), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for i, (label, series) in enumerate(groups.items()):
        color, ranks = f"C{i % 10}", [r["ranks"] for r in series]
        ax.plot(ranks, [r["max_rel_err"] for r in series], marker="o", linestyle="-", color=color)
        if "grad_max_rel_err" in series[0]:
            ax.plot(ranks, [r["grad_max_rel_err"] for r in series], marker="s", linestyle="--", color=color)
    _rank_axis(ax, sorted({r["ranks"] for r in rows}))
    ax.set_yscale("log")
    ax.set_ylabel("max |err| / max |ref| against float64")
    ax.set_title("accuracy against ranks (solid: output; dashed: largest gradient error)")
    handles = _group_handles(groups) + [
        Line2D([], [], color="black", marker="o", linestyle="-", label="output"),
        Line2D([], [], color="black", marker="s", linestyle="--", label="largest gradient error")]
    fig.legend(handles=handles, loc="outside lower center", ncols=columns, fontsize="small")
    return fig


def _png_filler(figure: Callable[[], Any]) -> Callable[[Path], None]:
    """Write the figure ``figure()`` makes as a PNG marked as report's (:data:`PNG_SOFTWARE`)."""
    def fill(tmp: Path) -> None:
        figure().savefig(tmp, format="png", dpi=120, metadata={"Software": PNG_SOFTWARE})
    return fill


def plot_filler(rows: Sequence[dict[str, Any]], title: str, eff_title: str, log_time: bool) -> Callable[[Path], None]:
    """The filler of a scaling plot of ``rows`` (:func:`scaling_figure`)."""
    return _png_filler(lambda: scaling_figure(rows, title, eff_title, log_time))


#: The plots: table, file name, and the filler of the file from the table's rows.
PLOTS: tuple[tuple[str, str, Callable[[Sequence[dict[str, Any]]], Callable[[Path], None]]], ...] = (
    ("strong_scaling", "strong_scaling.png",
     lambda rows: plot_filler(rows, "strong scaling", "efficiency = T(p0) p0 / (T(P) P)", True)),
    ("weak_scaling", "weak_scaling.png",
     lambda rows: plot_filler(rows, "weak scaling (ideal: flat)", "efficiency = T(p0) / T(P)", False)),
    ("accuracy_ranks", "accuracy_ranks.png", lambda rows: _png_filler(lambda: accuracy_figure(rows))),
)


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


def csv_filler(tables: dict[str, list[dict[str, Any]]]) -> Callable[[Path], None]:
    def fill(tmp: Path) -> None:
        with tmp.open("w", newline="", encoding="utf-8") as f:
            _write_csv_rows(tables, f)
            f.flush()
            os.fsync(f.fileno())
    return fill


def need_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError("plots need matplotlib: install the 'plot' extra (pip install 'hilbert_hpc[plot]')",
                        "--plot") from None
