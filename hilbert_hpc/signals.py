"""Stop requests: SIGUSR1, SIGTERM and Ctrl-C end a run at the next case boundary.

A handler only records the signal; the runner asks every rank at each case
boundary (one allgather, which also carries any rank's I/O error), so all ranks
stop together after the same case, with the results file flushed, and exit with
``REQUEUE_EXIT`` — the code the sbatch scripts in ``slurm/`` turn into
``scontrol requeue``; ``run --resume`` then continues the file. A second Ctrl-C
stops at once (complete cases stay intact).

Launchers differ in how long they let ranks run after a signal: SLURM's srun
forwards SIGTERM and kills only after ``KillWait`` (30 s by default); Open MPI 5's
``mpiexec`` forwards SIGUSR1, but on SIGTERM or Ctrl-C it kills its ranks about
0.25 s after forwarding SIGTERM, too soon to reach a boundary: send SIGUSR1 to
``mpiexec`` instead (docs/studies.md).
"""

from __future__ import annotations

import signal
import sys
from typing import Any

from .errors import UserError

#: exit code of a run stopped by a signal at a case boundary (EX_TEMPFAIL: "try again")
REQUEUE_EXIT = 75
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)


class StoppedForRequeue(UserError):
    """The run stopped early on request; its results file is consistent and can be resumed."""

    exit_code = REQUEUE_EXIT


class StopRequests:
    """Context manager: records stop signals while a job runs, restores the old handlers after."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._old: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and self.received == signal.SIGINT:
            raise KeyboardInterrupt          # Ctrl-C twice: stop now
        if self.received is None:
            self.received = signum
            if signum == signal.SIGINT and _prints():
                print("hilbert-hpc: interrupt: stopping after the current case (Ctrl-C again to stop now)",
                      file=sys.stderr, flush=True)

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

    def agreed(self, comm: Any, error: Exception | None = None) -> tuple[int, Exception | None]:
        """Collective at a case boundary: the signal any rank received (0 if none) and any rank's error."""
        from .mpi import agree_boundary

        return agree_boundary(comm, self.received or 0, error)


def _prints() -> bool:
    from .mpi import env_rank

    return env_rank() in (None, 0)
