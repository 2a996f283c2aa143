"""Stop requests from the batch system: SIGUSR1 / SIGTERM end a run at the next case boundary.

A handler only records the signal; the runner asks every rank at each case
boundary (one allreduce), so all ranks stop together after the same case,
with the results file flushed, and exit with ``REQUEUE_EXIT`` — the code the
sbatch scripts in ``slurm/`` turn into ``scontrol requeue``; ``run --resume``
then continues the file.
"""

from __future__ import annotations

import signal
from typing import Any

from .errors import UserError

#: exit code of a run stopped by a signal at a case boundary (EX_TEMPFAIL: "try again")
REQUEUE_EXIT = 75
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


class StoppedForRequeue(UserError):
    """The run stopped early on request; its results file is consistent and can be resumed."""

    exit_code = REQUEUE_EXIT


class StopRequests:
    """Context manager: records SIGUSR1/SIGTERM while a job runs, restores the old handlers after."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._old: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        self.received = signum

    def __enter__(self) -> "StopRequests":
        for sig in STOP_SIGNALS:
            try:
                self._old[sig] = signal.signal(sig, self._handler)
            except ValueError:          # not the main thread: no handlers, never stops early
                pass
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def agreed(self, comm: Any) -> int:
        """Collective: the signal any rank received (0 if none)."""
        return int(comm.allreduce(self.received or 0, op=_max_op()))


def _max_op() -> Any:
    try:
        from mpi4py import MPI

        return MPI.MAX
    except ImportError:  # the single-process stand-in ignores the operation
        return None
