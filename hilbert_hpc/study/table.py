"""The summary table printed while a job runs.

``checked`` is what the accuracy figure rests on: the sampled (row, head)
pairs that some pattern selects. A job with forward+backward cases also shows
each case's backward time (``bwd ms``, the slowest rank's median) and its
largest gradient error (``grad rel err``, docs/semantics.md section 10);
forward cases show ``-`` there.
"""

from __future__ import annotations

import math
from typing import TextIO

from hilbert_hpc.study.jobfile import Case
from hilbert_hpc.study.record import CaseRecord

#: (title, width, alignment) of every column, in order
COLUMNS = [("case", 28, "<"), ("ranks", 5, ">"), ("backend", 7, "<"), ("order", 8, "<"), ("causal", 6, "<"),
           ("dtype", 7, "<"), ("tokens", 10, ">"),
           ("attn ms", 10, ">"), ("bwd ms", 10, ">"), ("total ms", 10, ">"), ("tokens/s", 11, ">"),
           ("GFLOP/s", 9, ">"), ("max rel err", 11, ">"), ("grad rel err", 12, ">"), ("checked", 7, ">")]

#: the columns of the backward, shown when the job has forward+backward cases
BACKWARD_COLUMNS = ("bwd ms", "grad rel err")


class SummaryTable:
    """Fixed-width table, one row per finished case; ``backward``: with the backward's columns."""

    def __init__(self, stream: TextIO, backward: bool = False) -> None:
        self.stream, self.backward = stream, backward
        self.columns = [c for c in COLUMNS if backward or c[0] not in BACKWARD_COLUMNS]

    def _line(self, cells: dict[str, str]) -> None:
        text = "  ".join(f"{cells[name]:{align}{width}}" for name, width, align in self.columns)
        print(text.rstrip(), file=self.stream, flush=True)

    def header(self) -> None:
        """Print the column titles and a rule."""
        self._line({name: name for name, _, _ in self.columns})
        self._line({name: "-" * width for name, width, _ in self.columns})

    def row(self, case: Case, record: CaseRecord) -> None:
        """Print one case's medians, accuracy and the (row, head) pairs the accuracy rests on (and its
        backward time and gradient error, ``-`` for a forward case)."""
        m, acc = record.metrics, record.accuracy
        cells = {"case": case.case_id[:28], "ranks": str(case.ranks), "backend": case.backend,
                 "order": case.ordering[:8], "causal": "yes" if case.causal else "no", "dtype": case.dtype,
                 "tokens": f"{case.tokens * case.batch:,}", "attn ms": f"{m.median_attention_s * 1e3:.2f}",
                 "total ms": f"{m.median_total_s * 1e3:.2f}", "tokens/s": f"{m.tokens_per_s:.3g}",
                 "GFLOP/s": f"{m.useful_tflops * 1e3:.1f}", "max rel err": f"{acc.max_rel_err:.1e}",
                 "checked": f"{acc.selected_pairs:,}"}
        if self.backward:
            cells["bwd ms"] = _or_dash(m.median_backward_s * 1e3, ".2f")
            cells["grad rel err"] = _or_dash(acc.grad_max_rel_err, ".1e")
        self._line(cells)


def _or_dash(value: float, spec: str) -> str:
    """``value`` formatted, or ``-`` where it is NaN (a forward case's backward figures)."""
    return "-" if math.isnan(value) else format(value, spec)
