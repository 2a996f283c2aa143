"""Printing a report's tables as aligned plain text: compact by default, every column with ``wide``."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, TextIO

from hilbert_hpc.study.report_tables import EFFICIENCY_LIMIT, SPREAD_LIMIT, TABLES, table_notes


#: Compact tables that would be wider than this show groups as keys explained under the table.
COMPACT_WIDTH = 120


#: Compact tables cut case ids longer than this (the numbered prefix that makes them unique stays).
CASE_WIDTH = 21


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


def _some(name: str, cell: Callable[[dict], str]) -> Callable[[dict], str]:
    """``cell`` for a row that has field ``name`` (a forward+backward case), ``-`` for one that has not."""
    return lambda row: cell(row) if name in row else "-"


def _backward_cols(prefix: str, title: str, short: str) -> list[Col]:
    """The cases table's time [min, max] (compact: the median) and useful TFLOP/s of a forward+backward case's
    ``prefix`` (backward, forward_backward)."""
    need = f"{prefix}_s"
    return [Col(f"{title} ms [min, max]", _some(need, _range_ms(prefix)), f"{short} ms", needs=need,
                brief=_some(need, _key_of(need, _ms))),
            Col(f"{title} TFLOP/s", _some(need, _key_of(f"{prefix}_tflops", _fmt(".3g"))), f"{short} TFLOP/s",
                needs=need)]


def _scaling_backward_cols(prefix: str, title: str, short: str, strong: bool) -> list[Col]:
    """The scaling tables' columns of a forward+backward series' ``prefix`` (backward, forward_backward): time
    [min, max] (compact: the median), ideal time, speedup with its range (strong scaling), efficiency (weak
    scaling: with its range) and the verdict, as the forward's."""
    need = f"{prefix}_efficiency"
    cols = [Col(f"{title} ms [min, max]", _some(need, _range_ms(prefix)), f"{short} ms", needs=need,
                brief=_some(need, _key_of(f"{prefix}_s", _ms))),
            Col(f"{title} ideal ms", _some(need, _key_of(f"{prefix}_ideal_s", _ms)), None, needs=need)]
    if strong:
        cols += [Col(f"{title} speedup", _some(need, _key_of(f"{prefix}_speedup", _fmt(".2f"))), f"{short} speedup",
                     needs=need),
                 Col(f"{title} speedup range", _some(need, _ratio_range(f"{prefix}_speedup")), None, needs=need)]
    cols.append(Col(f"{title} efficiency", _some(need, _flagged(need, EFFICIENCY_LIMIT, ".2f")), f"{short} effic.",
                    needs=need))
    if not strong:
        cols.append(Col(f"{title} efficiency range", _some(need, _ratio_range(need)), None, needs=need))
    cols.append(Col(f"{title} vs spread", _some(need, _key_of(f"{prefix}_noise")), None, text=True, needs=need))
    return cols


def _backward_ring_cols() -> list[Col]:
    """The compute / communication table's columns of the backward ring (forward+backward cases)."""
    need = "backward_wait_s"
    return [Col("bwd ms", _some(need, _key_of("backward_s", _ms)), needs=need),
            Col("bwd local ms", _some(need, _key_of("backward_local_s", _ms)), None, needs=need),
            Col("bwd compute ms", _some(need, _key_of("backward_compute_s", _ms)), "bwd comp. ms", needs=need),
            Col("bwd wait ms", _some(need, _key_of("backward_wait_s", _ms)), needs=need),
            Col("bwd pack ms", _some(need, _key_of("backward_pack_s", _ms)), None, needs=need),
            Col("bwd imbalance ms", _some(need, _key_of("backward_imbalance_s", _ms)), None, needs=need),
            Col("bwd wait share", _some(need, _key_of("backward_wait_share", _fmt(".1%"))), needs=need),
            Col("bwd long overhead", _some(need, _key_of("backward_long_overhead", _fmt(".1%"))), "bwd long ovh.",
                needs=need),
            Col("bwd hop ms", _some(need, _key_of("backward_hop_s", _ms)), None, needs=need)]


def _peer_backward_cols(prefix: str, title: str) -> list[Col]:
    """The peer table's columns of a forward+backward pair's ``prefix`` (backward, forward_backward)."""
    need = f"{prefix}_ratio"
    return [Col(f"{title} ms", _some(need, _key_of(f"{prefix}_s", _ms)), None, needs=need),
            Col(f"peer {title} ms", _some(need, _key_of(f"peer_{prefix}_s", _ms)), None, needs=need),
            Col(f"{title} ratio", _some(need, _key_of(need, _fmt(".2f"))), needs=need),
            Col(f"{title} ratio range", _some(need, _ratio_range(need)), None, needs=need),
            Col(f"{title} vs spread", _some(need, _key_of(f"{prefix}_noise")), None, text=True, needs=need)]


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
    needs: str = ""             # shown only when some row has this field (the backward's, for forward+backward)
    brief: Callable[[dict], str] | None = None             # compact: another cell (the median without its range)

    def heading(self, wide: bool) -> str:
        """The column title in the chosen layout."""
        return self.title if wide or not self.short else self.short

    def shown(self, rows: Sequence[dict], wide: bool) -> bool:
        """Whether the column is printed for ``rows`` in the chosen layout."""
        return (wide or self.short is not None) and (not self.needs or any(self.needs in r for r in rows))

    def text_of(self, row: dict, wide: bool) -> str:
        """The cell of ``row`` in the chosen layout."""
        cell = self.cell(row) if wide or self.brief is None else self.brief(row)
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
              Col("checked (row, head) pairs", _key_of("checked_pairs", _fmt(",.0f")), None),
              *_backward_cols("backward", "bwd", "bwd"), *_backward_cols("forward_backward", "fwd+bwd", "f+b"),
              Col("max grad rel err", _some("backward_s", _key_of("grad_max_rel_err", _fmt(".1e"))), "grad err",
                  needs="backward_s")],
    "strong_scaling": [_text("group"), Col("ranks", _key_of("ranks"), "P"),
                       Col("attn ms [min, max]", _range_ms("attention")),
                       Col("ideal ms", _key_of("ideal_s", _ms), None), Col("speedup", _key_of("speedup", _fmt(".2f"))),
                       Col("speedup range", _ratio_range("speedup"), None),
                       Col("efficiency", _flagged("efficiency", EFFICIENCY_LIMIT, ".2f"), "effic."), _NOISE,
                       *_scaling_backward_cols("backward", "bwd", "bwd", strong=True),
                       *_scaling_backward_cols("forward_backward", "fwd+bwd", "f+b", strong=True)],
    "weak_scaling": [_text("group"), Col("ranks", _key_of("ranks"), "P"),
                     Col("tokens", _key_of("tokens", _fmt(",")), "N"),
                     Col("attn ms [min, max]", _range_ms("attention")),
                     Col("efficiency", _flagged("efficiency", EFFICIENCY_LIMIT, ".2f"), "effic."),
                     Col("efficiency range", _ratio_range("efficiency"), None), _NOISE,
                     *_scaling_backward_cols("backward", "bwd", "bwd", strong=False),
                     *_scaling_backward_cols("forward_backward", "fwd+bwd", "f+b", strong=False)],
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
                              Col("wait share", _key_of("wait_share", _fmt(".1%"))),
                              Col("long overhead", _key_of("long_overhead", _fmt(".1%")), "long ovh."),
                              Col("hop ms", _key_of("hop_s", _ms), None),
                              *_backward_ring_cols()],
    "imbalance": [_CASE, Col("ranks", _key_of("ranks"), "P"),
                  Col("causal", lambda r: "yes" if r["causal"] else "no", text=True),
                  Col("placement", _key_of("placement"), "place", text=True),
                  Col("FLOPs", _key_of("flops_imbalance", _fmt(".3f"))),
                  Col("attention time", _key_of("attention_imbalance", _fmt(".3f")), "attn time"),
                  Col("backward time", _some("backward_imbalance", _key_of("backward_imbalance", _fmt(".3f"))),
                      "bwd time", needs="backward_imbalance")],
    "peer_ratio": [_text("group"), _CASE, _text("backend"), Col("ranks", _key_of("ranks"), "P"),
                   Col("attn ms", _key_of("attention_s", _ms)), Col("peer", _key_of("peer_backend"), "peer", text=True),
                   Col("peer case", _key_of("peer_case"), None, text=True),
                   Col("peer ms", _key_of("peer_s", _ms)), Col("ratio", _key_of("ratio", _fmt(".2f"))),
                   Col("ratio range", _ratio_range("ratio"), None),
                   Col("ratio/GPU", _key_of("ratio_per_gpu", _fmt(".2f"))), _NOISE,
                   *_peer_backward_cols("backward", "bwd"), *_peer_backward_cols("forward_backward", "fwd+bwd")],
    "accuracy_ranks": [_text("group"), _CASE, Col("ranks", _key_of("ranks"), "P"),
                       Col("max rel err", _key_of("max_rel_err", _fmt(".2e")), "err"),
                       Col("growth", _key_of("growth", _fmt(".3f"))),
                       *(Col(title, _some(key, _key_of(key, _fmt(".2e"))), short, needs=key)
                         for key, title, short in (("grad_q_max_rel_err", "dQ max rel err", "dQ err"),
                                                   ("grad_k_max_rel_err", "dK max rel err", "dK err"),
                                                   ("grad_v_max_rel_err", "dV max rel err", "dV err"))),
                       Col("grad growth", _some("grad_growth", _key_of("grad_growth", _fmt(".3f"))),
                           needs="grad_growth")],
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
        columns = [c for c in COLUMNS[name] if c.shown(rows, wide)]
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
