"""``hilbert-hpc`` that sends itself SIGUSR1 at chosen moments: ``stop_signals.py PLACES run JOB ...``.

``PLACES`` (comma-separated) says where each rank signals itself, at once and without waiting:

- ``case``: after its first case (the ordinary stop at the next case boundary);
- ``end``: after the case loop, while the run tidies up (its communicators freed, then the final flush of the
  results file on rank 0);
- ``exit``: in the interpreter's last exit handler; then it checks that the signals stay ignored from there on
  (mpi4py finalizes MPI after Python has given every signal that has a handler of its own back its default
  action, which for SIGUSR1 kills) and says so on stderr if not.

The rest of the command line is the CLI's own (``main()`` reads it from ``sys.argv``, as the program does).
"""

import atexit
import os
import signal
import sys


def stop() -> None:
    os.kill(os.getpid(), signal.SIGUSR1)


def stop_at_exit() -> None:
    stop()
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        if signal.getsignal(sig) != signal.SIG_IGN:
            print(f"stop_signals: {sig.name} is not ignored while MPI is finalized", file=sys.stderr, flush=True)


places = set(sys.argv[1].split(","))
sys.argv = [sys.argv[0], *sys.argv[2:]]
if "exit" in places:
    atexit.register(stop_at_exit)      # registered first, so it runs last

from hilbert_hpc.cli import main  # noqa: E402
from hilbert_hpc.study import runner  # noqa: E402
from hilbert_hpc.study.results import ResultsFile  # noqa: E402


def after(cls: type, name: str, first_only: bool = False) -> None:
    """Signal this process when ``cls.name`` returns (the first time only, with ``first_only``)."""
    real, calls = getattr(cls, name), []

    def wrapped(*args, **kwargs):
        result = real(*args, **kwargs)
        calls.append(1)
        if len(calls) == 1 or not first_only:
            stop()
        return result

    setattr(cls, name, wrapped)


if "case" in places:
    after(runner.CaseLoop, "finished", first_only=True)
if "end" in places:
    after(runner.SubComms, "free")
    real_close = ResultsFile.close
    ResultsFile.close = lambda self, quiet=False: (stop(), real_close(self, quiet))[1]

sys.exit(main())
