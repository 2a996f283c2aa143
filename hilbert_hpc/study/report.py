"""Analysis of results files: per-case statistics, scaling, orderings, communication, PyTorch peer, bandwidth.

``report(paths)`` pools the complete cases of one or more results files
(docs/results.md) and the sweeps of bandwidth files, recomputes every
statistic from the raw timings and prints plain-text tables (compact by
default, every column with ``wide``); it can also write all rows to one CSV
file and draw the scaling curves as PNG files, under the same ownership rules
as ``run``'s outputs (:class:`ReportOutput`).

Statistics: for each repeat the slowest rank counts, ``t_rep = max over ranks``
of a timing; a case's time is the median over repeats of ``t_rep`` (with the
minimum and maximum over repeats as its spread).

Tables (each printed only when it has rows):

``cases``
    one row per case: median attention time [min, max], the spread
    max / min, tokens/s (``tokens * batch / median total``), useful TFLOP/s
    (``metrics.useful_flops / median attention``), max relative error; for
    ``pass = "forward+backward"`` cases also the median backward and
    forward+backward times [min, max] (their sum per rank and repeat), their
    useful TFLOP/s (2.5 and 3.5 x the forward's useful FLOPs) and the largest
    gradient error (columns printed only when some case has them).
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
``imbalance``
    cases on more than one rank: the load imbalance (largest / mean across
    ranks) of the useful FLOPs of the queries each rank owns, of the attention
    time and (forward+backward) of the backward time.
``peer_ratio``
    each case whose backend is not a peer against each peer case (``torch``,
    then ``flash``) with equal parameters except backend, transport, ranks and
    scaling (preferably on one rank): ``ratio = T(peer) / T(case)`` and ``ratio / ranks`` per GPU;
    a forward+backward pair also gets the ratios of the backward and of
    forward+backward, each with its range and verdict.
``bandwidth``
    the ring exchange rate (GB/s) per message size of each bandwidth file.

Every ratio (speedup, efficiency, ordering, peer) comes with its range over
the repeats and a verdict (:func:`compare`): ``within noise`` when the [min,
max] times of the two cases overlap. Notes under a table flag repeats that
spread more than :data:`SPREAD_LIMIT` and scaling efficiencies above
:data:`EFFICIENCY_LIMIT`. Groups are labelled with the transport the cases
used (recorded per case), not the one requested (``auto``).

When several files hold cases with identical parameters (``params_json``
completed with ``ranks`` and ``scaling``), the one that finished later (its
``finished_utc``; when that does not tell, the one of the file given later) is
kept and a note says so. A file whose cases were computed by more than one
version of the code (a resume by other code) gets a note naming them.
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TextIO

from hilbert_hpc.errors import UserError
from hilbert_hpc.study.output_files import NewOutput, OutputError, link_problem, os_reason, same_file
from hilbert_hpc.study.report_files import PLOTS, csv_filler, is_report_csv, is_report_png, need_matplotlib
from hilbert_hpc.study.report_format import print_tables
from hilbert_hpc.study.perflog import append_perflog, perflog_lines
from hilbert_hpc.study.regression import (REFERENCES_MARK, check as check_figures, figures_of_merit, read_references,
                                          references_text, system_name, verdict_lines)
from hilbert_hpc.study.report_read import Loaded, finish_time, load_files
from hilbert_hpc.study.report_tables import TABLES, build_tables, table_notes


def _inside(path: Path, folder: Path) -> bool:
    """True when ``path`` is ``folder`` or lies under it (after resolving links)."""
    path, folder = path.resolve(), folder.resolve()
    return path == folder or folder in path.parents


class ReportOutput(NewOutput):
    """One file a report writes (the CSV file or a plot), claimed as ``run`` claims its output (:class:`NewOutput`:
    lock ``<target>.lock``, temporary name renamed into place) with a report's owned files and wording.

    A target may not be a file given to the report, a job or input file they
    name, anything inside their output parts folders, a folder or a special
    file; an existing target is replaced only when report wrote it
    (:func:`is_report_csv`, :func:`is_report_png`) and ``overwrite`` is set.
    Refusals name the ``option`` that chose the file.
    """

    def __init__(self, path: Path, option: str, kind: str, is_ours: Callable[[Path], bool], loaded: Loaded,
                 overwrite: bool = False) -> None:
        super().__init__(path, kind, is_ours, loaded.protected_files, overwrite)
        self.option, self.folders = option, loaded.protected_folders

    def refuse(self) -> None:
        path, choose = self.path, f"choose another {self.option}"
        link = link_problem(path)
        if link:
            raise UserError(f"{link}: {choose}", self.option)
        for other, what in self.protected:
            if same_file(path, other):
                raise UserError(f"{str(path)!r} is the {what}; it is never replaced: {choose}", self.option)
        for folder, what in self.folders:
            if _inside(path, folder):
                raise UserError(f"{str(path)!r} is inside {str(folder)!r}, the {what}: {choose}", self.option)
        if path.is_dir():
            raise UserError(f"{str(path)!r} is a folder: {choose} file name", self.option)
        if path.exists() and not path.is_file():
            raise UserError(f"{str(path)!r} is not a regular file: {choose}", self.option)
        if path.parent.exists() and not path.parent.is_dir():
            raise UserError(f"{str(path.parent)!r} is not a folder: {choose}", self.option)

    def acquire_lock(self) -> None:
        try:
            super().acquire_lock()
        except OutputError as exc:                   # held by another command, or no lock file can be made
            cause = exc.message.split("; ")[0]
            raise UserError(f"{cause}; wait for it to end or choose another {self.option}", self.option) from None

    def refuse_existing(self) -> None:
        path = self.path
        if not path.exists():
            return
        if not self.is_ours(path):
            raise UserError(f"{str(path)!r} exists and is not a {self.kind} written by hilbert-hpc report; it is "
                            f"not replaced: move it away or choose another {self.option}", self.option)
        if not self.overwrite:
            raise UserError(f"{str(path)!r} exists; replace it with --overwrite or choose another {self.option}",
                            self.option)

    def write_file(self, fill: Callable[[Path], None]) -> None:
        try:
            super().write_file(fill)
        except OSError as exc:
            raise UserError(f"cannot write {str(self.path)!r}: {os_reason(exc)}", self.option) from None


@contextmanager
def claimed(outputs: Sequence[ReportOutput]) -> Iterator[None]:
    """Claim every output of a report before anything is written: all refusals first, then the locks, held to
    the end (all released on any refusal)."""
    paths = [o.path.resolve() for o in outputs]
    if len(set(paths)) < len(paths):
        raise UserError("the CSV file is also one of the plot files: choose another --csv", "--csv")
    for output in outputs:
        output.refuse()
    try:
        for output in outputs:
            output.claim()
        yield
    finally:
        for output in outputs:
            output.release()


def _plot_targets(tables: dict[str, list[dict[str, Any]]],
                  plot_dir: str | Path | None, loaded: Loaded,
                  overwrite: bool) -> list[tuple[ReportOutput, tuple[Any, ...]]]:
    """The plots to write (those whose table has rows), each with its entry of :data:`PLOTS`."""
    if plot_dir is None:
        return []
    need_matplotlib()
    directory = Path(plot_dir)
    if directory.exists() and not directory.is_dir():
        raise UserError(f"{str(directory)!r} is not a folder: choose another --plot folder", "--plot")
    return [(ReportOutput(directory / plot[1], "--plot", "plot", is_report_png, loaded, overwrite), plot)
            for plot in PLOTS if tables.get(plot[0])]


@dataclass
class Regression:
    """What a report checks and records (docs/studies.md, "Regression checks"): references to check against
    (``check``, a TOML file), a references file to write from the results (``save_references``), a perflog to
    append to (``perflog``), the system name they are kept under (``system``), and ``json``: print the figures
    of merit as JSON instead of the tables (what a ReFrame check reads)."""

    check: str | Path | None = None
    save_references: str | Path | None = None
    perflog: str | Path | None = None
    system: str | None = None
    json: bool = False

    def wanted(self) -> bool:
        """Whether the figures of merit are needed at all."""
        return bool(self.check or self.save_references or self.perflog or self.json)


def _job_names(paths: Sequence[str | Path]) -> dict[str, str]:
    """The job name recorded in each results file (by path as given)."""
    import h5py

    names = {}
    for path in paths:
        try:
            with h5py.File(path, "r") as h5:
                names[str(path)] = str(h5.attrs.get("job_name", ""))
        except (OSError, ValueError):
            names[str(path)] = ""
    return names


def report(paths: Sequence[str | Path], stream: TextIO | None = None, csv_path: str | Path | None = None,
           plot_dir: str | Path | None = None, overwrite: bool = False, wide: bool = False,
           regression: Regression | None = None) -> dict[str, list[Any]]:
    """Print the tables; write CSV / PNG plots when asked; check, save and log the figures of merit when
    ``regression`` asks (:class:`Regression`); return the table rows (for tests).

    Every refusal of an output (:class:`ReportOutput`) comes before anything
    is printed or written. ``wide`` prints every column; the compact default
    fits about :data:`COMPACT_WIDTH` columns (the CSV always has every field).
    The result maps each table name of :data:`TABLES` to its rows (dicts,
    times in seconds), ``"notes"`` to the note lines printed, ``"plots"``
    to the PNG files written, ``"figures"`` and ``"verdicts"`` to the figures of merit and their verdicts
    (:mod:`hilbert_hpc.study.regression`).
    """
    stream = stream or sys.stdout
    regression = regression or Regression()
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    loaded = load_files(paths)
    notes = loaded.notes
    tables: dict[str, list[Any]] = build_tables(loaded.cases, notes, loaded.sweeps)
    system = system_name(regression.system)
    figures = figures_of_merit(tables) if regression.wanted() else []
    references = read_references(regression.check, system) if regression.check else {}
    verdicts = check_figures(figures, references) if regression.check else []
    if regression.check and not verdicts:
        raise UserError(f"the references in {str(regression.check)!r} for system {system!r} name no case and "
                        f"figure of these results (their case ids: "
                        f"{', '.join(sorted({f.case for f in figures})) or 'none'})", "--check")
    csv_target = ([ReportOutput(Path(csv_path), "--csv", "CSV file", is_report_csv, loaded, overwrite)]
                  if csv_path is not None else [])
    refs_target = ([ReportOutput(Path(regression.save_references), "--save-references", "references file",
                                 is_references_file, loaded, overwrite)]
                   if regression.save_references is not None else [])
    plots = _plot_targets(tables, plot_dir, loaded, overwrite)
    files = {str(p): i + 1 for i, p in enumerate(dict.fromkeys(str(p) for p in paths))}
    with claimed(csv_target + refs_target + [target for target, _ in plots]):
        # written before anything is printed: a reader that leaves early (| head) cannot cost the files
        if csv_target:
            csv_target[0].write_file(csv_filler(tables))
        if refs_target:
            text = references_text(figures, system)
            refs_target[0].write_file(lambda tmp: tmp.write_text(text))
        for target, (name, _, filler) in plots:
            target.write_file(filler(tables[name]))
        if regression.perflog is not None:
            finished = {c.case_id: (when.isoformat(timespec="seconds") if (when := finish_time(c)) else "")
                        for c in loaded.cases}
            jobs_of = _job_names(paths)
            jobs = {c.case_id: jobs_of.get(c.file, "") for c in loaded.cases}
            append_perflog(regression.perflog, perflog_lines(figures, verdicts, system, finished, jobs))
        if regression.json:
            print(json.dumps(figures_json(figures, loaded.cases, verdicts, system), indent=1), file=stream)
            tables.update(figures=figures, verdicts=verdicts, notes=notes, plots=[])
            return tables
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
        if refs_target:
            print(f"references -> {regression.save_references} ({len(figures)} figure(s), system {system!r})",
                  file=stream)
        if regression.perflog is not None:
            print(f"perflog -> {regression.perflog} ({len(figures)} line(s))", file=stream)
        if verdicts:
            print(file=stream)
            for line in verdict_lines(verdicts, system):
                print(line, file=stream)
    tables["notes"] = notes + [n for name in TABLES for n in table_notes(name, tables.get(name, []))]
    tables["plots"] = [str(target.path) for target, _ in plots]
    tables["figures"], tables["verdicts"] = figures, verdicts
    return tables


def is_references_file(path: Path) -> bool:
    """True for a references file that ``report --save-references`` wrote (its first line)."""
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            return f.readline().startswith(REFERENCES_MARK)
    except OSError:
        return False


def figures_json(figures: Sequence[Any], cases: Sequence[Any], verdicts: Sequence[Any], system: str) -> dict:
    """The figures of merit per case, as ``report --json`` prints them (what a ReFrame check extracts): each
    case's id, name, backend, dtype, ranks, accuracy verdict, and figures (value, min, max over the repeats,
    unit, and the reference check's result where references were given)."""
    checked = {(v.figure.case, v.figure.figure): v.result for v in verdicts}
    out: dict[str, Any] = {"system": system, "cases": []}
    for c in cases:
        mine = [f for f in figures if f.case == c.case_id]
        out["cases"].append({
            "case": c.case_id, "name": c.params.get("name", ""), "backend": c.params.get("backend", ""),
            "dtype": c.params.get("dtype", ""), "ranks": c.ranks,
            "within_tolerance": bool(c.accuracy.within_tolerance),
            "figures": {f.figure: {"value": f.value, "min": f.low, "max": f.high, "unit": f.unit,
                                   **({"result": checked[c.case_id, f.figure]}
                                      if (c.case_id, f.figure) in checked else {})} for f in mine}})
    return out
