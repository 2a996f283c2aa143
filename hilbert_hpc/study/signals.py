"""Stop requests: SIGUSR1, SIGTERM and Ctrl-C end a run at the next case boundary.

A handler only records the signal; the runner asks every rank at each case
boundary (one allgather, which also carries any rank's I/O error), so all ranks
stop together after the same case, with the results file flushed, and exit with
``REQUEUE_EXIT`` — the code the sbatch scripts in ``slurm/`` turn into
``scontrol requeue``; ``run --resume`` then continues the file. A second Ctrl-C
stops at once (complete cases stay intact).

Any number of SIGUSR1 or SIGTERM, at any moment of a ``run`` process, ends it
with ``REQUEUE_EXIT``: :class:`HeldStops` records them from the start of the
command to the process's end (their default action would kill it with 138 or
143: before the case loop, after it, during the final flush or MPI's finalize),
and ignores them once the interpreter shuts down.

Launchers differ in how long they let ranks run after a signal: SLURM's srun
forwards SIGTERM and kills only after ``KillWait`` (30 s by default); Open MPI 5's
``mpiexec`` forwards SIGUSR1, but on SIGTERM or Ctrl-C it kills its ranks about
0.25 s after forwarding SIGTERM, too soon to reach a boundary: send SIGUSR1 to
``mpiexec`` instead (docs/studies.md).

Once Open MPI's launcher has begun ending its ranks it no longer forwards their
output, so a line they print then is lost (a Ctrl-C of ``mpiexec`` used to end
in 0.5 s, exit 1 and nothing on stderr). Rank 0, started by that launcher on
its node, therefore says what was kept straight on the launcher's own standard
error (``/proc/<launcher>/fd/2``), from a thread woken by the signal itself
(``signal.set_wakeup_fd``), so that neither a blocked MPI call nor the SIGKILL
that follows within a second can swallow it.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from typing import Any, Callable

from hilbert_hpc.errors import UserError

#: exit code of a run stopped by a signal at a case boundary (EX_TEMPFAIL: "try again")
REQUEUE_EXIT = 75
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)


class StoppedForRequeue(UserError):
    """The run stopped early on request; its results file is consistent and can be resumed."""

    exit_code = REQUEUE_EXIT


#: Open MPI launchers (their process names) that end their ranks within a second of a SIGINT or SIGTERM
OPEN_MPI_LAUNCHERS = ("prterun", "mpiexec", "mpirun", "orterun", "prte")
#: signals after which such a launcher kills its ranks (it forwards SIGUSR1 and waits)
LAUNCHER_KILLS = (signal.SIGINT, signal.SIGTERM)


def launcher_stderr() -> int | None:
    """A descriptor writing to the standard error of the Open MPI launcher that started this process, or None.

    None when this process is not an Open MPI rank whose parent is the launcher
    itself (under srun, or on a node where a daemon started it), or where
    ``/proc`` cannot tell. Opened for appending and non-blocking: a write never
    overwrites a redirected file and never waits.
    """
    if "OMPI_COMM_WORLD_RANK" not in os.environ:
        return None
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/comm") as fh:
            if fh.read().strip() not in OPEN_MPI_LAUNCHERS:
                return None
        return os.open(f"/proc/{parent}/fd/2", os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
    except OSError:
        return None


class LauncherNotice:
    """Writes one line to the launcher's stderr when it is about to end the ranks (SIGINT/SIGTERM).

    ``status`` returns what is kept and how to go on (e.g. "2 of 4 cases are
    complete in r.h5; continue with 'run --resume'");
    it is called when the signal comes. A daemon thread waits on the wake-up
    descriptor that Python's C-level signal handler writes the signal number to.
    """

    def __init__(self, target: int, status: Callable[[], str]) -> None:
        self.target, self.status = target, status
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._old_wakeup = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="hilbert-hpc-signal-notice", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        """Say the line at the first SIGINT/SIGTERM, then keep draining the wake-up pipe until :meth:`close`:
        a closed read end would make Python's handler fail (and print) at every later signal."""
        said = False
        try:
            while True:
                data = os.read(self._read, 64)
                if not data:
                    return
                kills = [s for s in data if s in LAUNCHER_KILLS]
                if kills and not said:
                    self._say(signal.Signals(kills[0]).name)
                    said = True
        except OSError:
            return
        finally:
            os.close(self._read)

    def _say(self, name: str) -> None:
        line = (f"hilbert-hpc: interrupted: mpiexec sent {name} and ends the ranks now; {self.status()} (to stop "
                f"at a case boundary instead, send SIGUSR1 to mpiexec)\n")
        try:
            os.write(self.target, line.encode())
        except OSError:
            pass

    def close(self) -> None:
        """Restore the previous wake-up descriptor and end the thread."""
        signal.set_wakeup_fd(self._old_wakeup)
        os.close(self._write)                    # the thread reads end-of-file and closes its end
        self._thread.join(timeout=1.0)
        os.close(self.target)


#: the stop signals held for the whole of a ``run`` process (outside the case loop Ctrl-C stays Python's
#: KeyboardInterrupt: the run stops at once, with its complete cases kept)
HELD_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
#: the :class:`HeldStops` of this process while it is held
_held: "HeldStops | None" = None


class HeldStops:
    """Context manager: SIGUSR1 and SIGTERM are recorded, never fatal, while a ``run`` command works.

    Python's default action for both ends the process (exit 138 or 143, -10 or
    -15 for its parent): a signal before the case loop began, a second one after
    it stopped, or one during the final flush of the results file or MPI's
    finalize would turn a run that stops with ``REQUEUE_EXIT`` into a killed one.
    :class:`StopRequests` takes over during the case loop and starts from the
    signal recorded here; ``received`` is the first stop signal of either (0:
    none). With ``to_exit`` (the program itself, which ends when the command
    does) the handlers stay to the process's end, and its last exit handler
    ignores the signals (``SIG_IGN``, which Python's shutdown keeps, unlike a
    handler of its own); otherwise the old handlers come back on exit.
    """

    def __init__(self, to_exit: bool = False) -> None:
        self.received = 0
        self.to_exit = to_exit
        self._old: dict[int, Any] = {}

    def _record(self, signum: int, frame: Any) -> None:
        self.received = self.received or signum

    def __enter__(self) -> "HeldStops":
        global _held
        for sig in HELD_SIGNALS:
            try:
                self._old[sig] = signal.signal(sig, self._record)
            except ValueError:          # not the main thread: nothing to hold
                pass
        _held = self
        if self.to_exit:
            atexit.register(_ignore_held)
        return self

    def __exit__(self, *exc: Any) -> None:
        global _held
        if self.to_exit:
            return                      # held until the process ends
        for sig, old in self._old.items():
            signal.signal(sig, old)
        _held = None


def _ignore_held() -> None:
    """At exit: the held stop signals are ignored from now on (the exit status is decided)."""
    if _held is not None and _held.to_exit:
        for sig in _held._old:
            signal.signal(sig, signal.SIG_IGN)


def held_signal() -> int:
    """The first stop signal this ``run`` process received (0: none, or no :class:`HeldStops` is held)."""
    return _held.received if _held is not None else 0


class StopRequests:
    """Context manager: records stop signals while a job runs, restores the old handlers after.

    A signal that a :class:`HeldStops` recorded before counts as received here,
    and one received here is recorded there too.

    ``status`` (optional) says what is kept so far and how to go on, e.g. "2 of
    4 cases are complete in r.h5; continue with 'run --resume'": with it, rank 0 under Open MPI's launcher tells the
    launcher's stderr at once when it is about to be ended (:class:`LauncherNotice`).
    """

    def __init__(self, status: Callable[[], str] | None = None) -> None:
        self.received: int | None = None
        self.status = status
        self._old: dict[int, Any] = {}
        self._notice: LauncherNotice | None = None

    def _handler(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and self.received == signal.SIGINT:
            raise KeyboardInterrupt          # Ctrl-C twice: stop now
        if _held is not None:
            _held.received = _held.received or signum
        if self.received is None:
            self.received = signum
            if signum == signal.SIGINT and _prints():
                print("hilbert-hpc: interrupt: stopping after the current case (Ctrl-C again to stop now)",
                      file=sys.stderr, flush=True)

    def __enter__(self) -> "StopRequests":
        self.received = self.received or held_signal() or None
        for sig in STOP_SIGNALS:
            try:
                self._old[sig] = signal.signal(sig, self._handler)
            except ValueError:          # not the main thread: no handlers, never stops early
                pass
        if self._old and self.status is not None and _prints():
            target = launcher_stderr()
            if target is not None:
                self._notice = LauncherNotice(target, self.status)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._notice is not None:
            self._notice.close()
            self._notice = None
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def agreed(self, comm: Any, error: Exception | None = None) -> tuple[int, Exception | None]:
        """Collective at a case boundary: the signal any rank received (0 if none) and any rank's error."""
        from hilbert_hpc.distributed.mpi import agree_boundary

        return agree_boundary(comm, self.received or 0, error)


def _prints() -> bool:
    from hilbert_hpc.distributed.mpi import env_rank

    return env_rank() in (None, 0)
