"""``report --history PERFLOG``: a perflog's runs as a table over time and, with ``--plot DIR``, a plot."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from hilbert_hpc.errors import UserError
from hilbert_hpc.study.output_files import NewOutput
from hilbert_hpc.study.perflog import history_lines, plot_history, read_perflog
from hilbert_hpc.study.report_files import is_report_png, need_matplotlib

#: the figure a history plot shows by default
DEFAULT_FIGURE = "attention_s"


def report_history(perflog: str | Path, figure: str | None = None, plot_dir: str | Path | None = None,
                   overwrite: bool = False, stream: TextIO | None = None) -> list[str]:
    """Print the history table of ``perflog`` (of ``figure`` alone when given); with ``plot_dir``, write
    ``history_<figure>.png`` there (replacing only a plot report wrote, with ``overwrite``). Returns the lines."""
    stream = stream or sys.stdout
    entries = read_perflog(perflog)
    if figure is not None and not any(e.figure == figure for e in entries):
        raise UserError(f"perflog {str(perflog)!r} has no figure {figure!r} (it has "
                        f"{', '.join(sorted({e.figure for e in entries})) or 'none'})", "--figure")
    lines = history_lines(entries, figure)
    target = None
    if plot_dir is not None:
        need_matplotlib()
        shown = figure or DEFAULT_FIGURE
        folder = Path(plot_dir)
        if folder.exists() and not folder.is_dir():
            raise UserError(f"{str(folder)!r} is not a folder: choose another --plot folder", "--plot")
        with NewOutput(folder / f"history_{shown}.png", "plot", is_report_png, [(perflog, "perflog")],
                       overwrite) as out:
            out.write_file(lambda tmp: plot_history(entries, shown, tmp))
            target = out.path
    for line in lines:
        print(line, file=stream)
    if target is not None:
        print(f"plot -> {target}", file=stream)
    return lines
