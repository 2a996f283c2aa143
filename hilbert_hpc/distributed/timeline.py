"""Where a long pattern's time goes: marks on the host clock and, on a GPU, on the compute stream.

A :class:`Timeline` given to :func:`hilbert_hpc.distributed.ring.ring_dilated_forward` (``timeline=``) records a
mark at each phase of every long pattern (packing, posting, each hop's launches, waits, copies): the host time
when the mark was reached and, for CuPy arrays, an event recorded on the current stream, whose time is when the
GPU got there. The gap between the two clocks shows where the host runs ahead of the GPU (launch-bound) or
waits for it (compute-bound); the steps between marks show what each phase costs. ``tests/scripts/hop_timeline.py``
prints it for a ring and a gathered pattern.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Mark:
    """One mark: its name, the host time (s, ``time.perf_counter``) and a CUDA event or None."""

    name: str
    host_s: float
    event: Any = None


@dataclass
class Timeline:
    """Marks in the order they were reached (see the module's docstring)."""

    marks: list[Mark] = field(default_factory=list)

    def mark(self, name: str, xp: Any = None) -> None:
        """Record ``name`` now on the host and, when ``xp`` is CuPy, on its current stream."""
        event = xp.cuda.get_current_stream().record() if xp is not None and xp.__name__ == "cupy" else None
        self.marks.append(Mark(name, time.perf_counter(), event))

    def rows(self) -> list[tuple[str, float, float | None]]:
        """``(name, host ms, GPU ms)`` of every mark since the first (GPU: None without events); waits for the
        GPU to pass the last event."""
        if not self.marks:
            return []
        first = self.marks[0]
        events = [m.event for m in self.marks if m.event is not None]
        if events:
            events[-1].synchronize()
        out = []
        for m in self.marks:
            gpu = None
            if m.event is not None and first.event is not None:
                import cupy

                gpu = cupy.cuda.get_elapsed_time(first.event, m.event)
            out.append((m.name, (m.host_s - first.host_s) * 1e3, gpu))
        return out

    def table(self) -> str:
        """The marks as lines: name, host ms, GPU ms, and the host's and the GPU's step since the previous."""
        lines = [f"{'mark':<28} {'host ms':>9} {'gpu ms':>9} {'host step':>9} {'gpu step':>9}"]
        prev_host, prev_gpu = 0.0, 0.0
        for name, host, gpu in self.rows():
            gpu_text = "-" if gpu is None else f"{gpu:9.3f}"
            step = "-" if gpu is None else f"{gpu - prev_gpu:9.3f}"
            lines.append(f"{name:<28} {host:9.3f} {gpu_text:>9} {host - prev_host:9.3f} {step:>9}")
            prev_host, prev_gpu = host, (gpu if gpu is not None else prev_gpu)
        return "\n".join(lines)


class _Off:
    """No timeline: marks cost nothing."""

    def mark(self, name: str, xp: Any = None) -> None:
        """Nothing."""


#: what the ring marks on when no timeline is given
OFF = _Off()
