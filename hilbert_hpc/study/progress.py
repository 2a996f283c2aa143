"""Progress of a job on rank 0: one line per finished case with the share of the work and an ETA.

Each line carries a text bar (``[#####...............]``) and is printed once,
not redrawn, so batch logs stay readable; the ETA weighs the remaining cases by
their useful FLOPs, learned from the cases done so far.
"""

from __future__ import annotations

import time
from typing import TextIO

BAR_WIDTH = 20


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class Progress:
    """Work-weighted progress over a list of cases; silent unless ``stream`` is given."""

    def __init__(self, work: list[float], stream: TextIO | None) -> None:
        self.work = [max(w, 1.0) for w in work]
        self.total = sum(self.work)
        self.done_work = 0.0
        self.done = 0
        self.stream = stream
        self.start = time.perf_counter()

    def advance(self, index: int, label: str) -> str:
        """Mark case ``index`` finished; print and return the progress line."""
        self.done += 1
        self.done_work += self.work[index]
        elapsed = time.perf_counter() - self.start
        left = self.total - self.done_work
        eta = elapsed / self.done_work * left if self.done_work else float("nan")
        share = self.done_work / self.total
        bar = "#" * int(round(BAR_WIDTH * share))
        line = (f"progress: [{bar:.<{BAR_WIDTH}}] {self.done}/{len(self.work)} cases, {100 * share:.0f}% of the "
                f"work, {_duration(elapsed)} elapsed" + (f", about {_duration(eta)} left" if left > 0 else "")
                + f" ({label})")
        if self.stream is not None:
            print(line, file=self.stream, flush=True)
        return line
