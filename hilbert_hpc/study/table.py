"""The summary table printed while a job runs.

``checked`` is what the accuracy figure rests on: the sampled (row, head)
pairs that some pattern selects.
"""

from __future__ import annotations

from typing import TextIO

from hilbert_hpc.study.jobfile import Case
from hilbert_hpc.study.record import CaseRecord

COLUMNS = [("case", 28, "<"), ("ranks", 5, ">"), ("backend", 7, "<"), ("order", 8, "<"), ("causal", 6, "<"),
           ("dtype", 7, "<"), ("tokens", 10, ">"),
           ("attn ms", 10, ">"), ("total ms", 10, ">"), ("tokens/s", 11, ">"), ("GFLOP/s", 9, ">"),
           ("max rel err", 11, ">"), ("checked", 7, ">")]


class SummaryTable:
    """Fixed-width table, one row per finished case."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def _line(self, cells: list[str]) -> None:
        text = "  ".join(f"{c:{align}{width}}" for c, (_, width, align) in zip(cells, COLUMNS))
        print(text.rstrip(), file=self.stream, flush=True)

    def header(self) -> None:
        """Print the column titles and a rule."""
        self._line([name for name, _, _ in COLUMNS])
        self._line(["-" * width for _, width, _ in COLUMNS])

    def row(self, case: Case, record: CaseRecord) -> None:
        """Print one case's medians, accuracy and the (row, head) pairs the accuracy rests on."""
        m, acc = record.metrics, record.accuracy
        self._line([case.case_id[:28], str(case.ranks), case.backend, case.ordering[:8],
                    "yes" if case.causal else "no", case.dtype, f"{case.tokens * case.batch:,}",
                    f"{m.median_attention_s * 1e3:.2f}", f"{m.median_total_s * 1e3:.2f}",
                    f"{m.tokens_per_s:.3g}", f"{m.useful_tflops * 1e3:.1f}", f"{acc.max_rel_err:.1e}",
                    f"{acc.selected_pairs:,}"])
