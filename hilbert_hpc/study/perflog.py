"""A performance log: one line per case and figure of every checked run, in ReFrame's perflog form.

``report --perflog PATH`` appends the figures of merit of its results files
(:mod:`hilbert_hpc.study.regression`), each with its reference and verdict when
``--check`` gives references: ``|``-separated fields :data:`FIELDS` (completion
time of the case, system, job, case, case name, figure, value, unit, reference,
lower and upper thresholds, result). The lines of one report are written in one
``write`` under an exclusive lock of the file (``fcntl.flock``), so jobs that
finish together never interleave; a new file starts with a header line.
``report --history PATH`` reads it back (:func:`read_perflog`) into a table of
a figure over time and, with ``--plot DIR``, a plot.
"""

from __future__ import annotations

import datetime
import math
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from hilbert_hpc.errors import UserError
from hilbert_hpc.study.regression import Figure, Verdict

#: the fields of a line, in order
FIELDS = ("completion_time", "system", "job", "case", "name", "figure", "value", "unit", "reference", "lower",
          "upper", "result")
HEADER = "# hilbert-hpc perflog 1: " + "|".join(FIELDS)


@dataclass(frozen=True)
class Entry:
    """One line of a perflog."""

    completion_time: str
    system: str
    job: str
    case: str
    name: str
    figure: str
    value: float
    unit: str
    reference: str
    lower: str
    upper: str
    result: str


def _text(x: Any) -> str:
    return "" if x is None else str(x).replace("|", "/").replace("\n", " ")


def _number(x: float | None) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else repr(float(x))


def perflog_lines(figures: Sequence[Figure], verdicts: Sequence[Verdict], system: str,
                  finished: dict[str, str], jobs: dict[str, str]) -> list[str]:
    """The lines of ``figures`` (their verdicts where checked); ``finished`` and ``jobs``: each case's completion
    time (ISO 8601) and job name."""
    checked = {(v.figure.case, v.figure.figure): v for v in verdicts}
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    lines = []
    for f in figures:
        v = checked.get((f.case, f.figure))
        ref = (_number(v.reference.value), _number(v.reference.lower), _number(v.reference.upper), v.result) \
            if v else ("", "", "", "")
        fields = (finished.get(f.case) or now, system, jobs.get(f.case, ""), f.case, f.name, f.figure,
                  _number(f.value), f.unit, *ref)
        lines.append("|".join(_text(x) for x in fields))
    return lines


@contextmanager
def _locked(path: Path) -> Iterator[Any]:
    """``path`` opened for appending under an exclusive lock, held until the block ends."""
    import fcntl

    try:
        handle = open(path, "a", encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot append to perflog {str(path)!r}: {exc.strerror or exc}", "--perflog") from None
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        yield handle
    finally:
        handle.close()              # closing releases the lock


def append_perflog(path: str | Path, lines: Sequence[str]) -> None:
    """Append ``lines`` to the perflog ``path`` in one write under its lock (a new or empty file gets the
    header first); refuses a file that is not a perflog."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{str(path)!r} is a folder: --perflog names a file", "--perflog")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot make the folder of perflog {str(path)!r}: {exc.strerror or exc}", "--perflog") from None
    with _locked(path) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size:
            with open(path, encoding="utf-8", errors="replace") as head:
                first = head.readline().rstrip("\n")
            if first != HEADER:
                raise UserError(f"{str(path)!r} is not a hilbert-hpc perflog (its first line is not the perflog "
                                f"header); it is not appended to: choose another --perflog", "--perflog")
        text = ("" if size else HEADER + "\n") + "".join(line + "\n" for line in lines)
        try:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        except OSError as exc:            # a full disk: cut off what part of the lines landed
            try:
                os.ftruncate(handle.fileno(), size)
            except OSError:
                pass
            raise UserError(f"cannot append to perflog {str(path)!r}: {exc.strerror or exc}; the perflog is left as "
                            f"it was", "--perflog") from None


def read_perflog(path: str | Path) -> list[Entry]:
    """Every line of the perflog ``path``."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UserError(f"perflog {str(path)!r} does not exist", "--history") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read perflog {str(path)!r}: {exc}", "--history") from None
    if not lines or lines[0] != HEADER:
        raise UserError(f"{str(path)!r} is not a hilbert-hpc perflog (no perflog header)", "--history")
    out = []
    for number, line in enumerate(lines[1:], start=2):
        parts = line.split("|")
        if len(parts) != len(FIELDS):
            raise UserError(f"{path}:{number}: a perflog line has {len(FIELDS)} fields, this one {len(parts)}",
                            "--history")
        values: dict[str, Any] = dict(zip(FIELDS, parts))
        values["value"] = float(values["value"]) if values["value"] else math.nan
        out.append(Entry(**values))
    return out


def history_lines(entries: Sequence[Entry], figure: str | None = None) -> list[str]:
    """A table of each (system, job, case, figure) over time, oldest first: one line per run."""
    chosen = [e for e in entries if figure is None or e.figure == figure]
    if not chosen:
        return [f"no perflog line{' of figure ' + repr(figure) if figure else ''}"]
    chosen.sort(key=lambda e: (e.system, e.job, e.case, e.figure, e.completion_time))
    lines = [f"{'completion time':<25} {'system':<12} {'job':<16} {'case':<6} {'name':<18} {'figure':<19} "
             f"{'value':>11} {'unit':<8} {'reference':>10} result"]
    for e in chosen:
        lines.append(f"{e.completion_time:<25} {e.system:<12} {e.job:<16} {e.case:<6} {e.name:<18} {e.figure:<19} "
                     f"{e.value:>11.4g} {e.unit:<8} {e.reference or '-':>10} {e.result or '-'}")
    return lines


def plot_history(entries: Sequence[Entry], figure: str, target: Path) -> None:
    """A PNG of ``figure`` over completion time, one line per (system, job, case), failed runs marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[tuple[str, str, str], list[Entry]] = {}
    for e in entries:
        if e.figure == figure:
            series.setdefault((e.system, e.job, e.case), []).append(e)
    fig, ax = plt.subplots(figsize=(7, 4))
    for (system, job, case), points in sorted(series.items()):
        points.sort(key=lambda e: e.completion_time)
        times = [datetime.datetime.fromisoformat(e.completion_time) for e in points]
        ax.plot(times, [e.value for e in points], marker="o", label=f"{system} {job} {case}")
        bad = [(t, e.value) for t, e in zip(times, points) if e.result == "fail"]
        if bad:
            ax.scatter(*zip(*bad), color="red", zorder=3, s=60, marker="x")
    unit = next((e.unit for e in entries if e.figure == figure), "")
    ax.set_ylabel(f"{figure} ({unit})")
    ax.set_title(f"hilbert-hpc perflog: {figure} over time (x: failed its reference)")
    ax.legend(fontsize=7)
    fig.autofmt_xdate()
    fig.tight_layout()
    from hilbert_hpc.study.report_files import PNG_SOFTWARE

    fig.savefig(target, format="png", dpi=100, metadata={"Software": PNG_SOFTWARE})
    plt.close(fig)
