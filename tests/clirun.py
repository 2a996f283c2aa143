"""``hilbert-hpc ARGS`` run inside the test process: what a subprocess would give, without its start-up.

``run_in_process(args, cwd)`` calls :func:`hilbert_hpc.cli.main` in ``cwd`` with standard output and error
captured, and returns a ``subprocess.CompletedProcess`` (exit code, stdout, stderr) as ``subprocess.run`` of
``python -m hilbert_hpc ARGS`` would; ``env`` sets variables for the call (ones the package reads when it runs,
not at start-up). Warnings the command raises land on its stderr, under Python's default filters, as they would
in a process of its own. An exception that escapes ``main`` (a crash, which a process
would print as a traceback) propagates and fails the test.

Tests keep a real process where the process is the point: signals, exit by a signal, a closed or full standard
output, the environment a process starts with (thread limits, CUDA_VISIBLE_DEVICES), several ranks under mpiexec.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import warnings
from pathlib import Path
from typing import Mapping, Sequence

#: the categories Python ignores by default (outside ``__main__``)
_IGNORED_BY_DEFAULT = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


def run_in_process(args: Sequence[str], cwd: Path | str,
                   env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m hilbert_hpc *args`` in ``cwd`` (``env`` added), run by this process: its exit code, stdout
    and stderr."""
    from hilbert_hpc.cli import main

    out, err = io.StringIO(), io.StringIO()
    here, saved = os.getcwd(), {name: os.environ.get(name) for name in env or {}}
    os.chdir(cwd)
    os.environ.update(env or {})
    try:
        with warnings.catch_warnings(record=True) as caught, \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            warnings.resetwarnings()
            for category in _IGNORED_BY_DEFAULT:
                warnings.filterwarnings("ignore", category=category)
            try:
                code = main(list(args))
            except SystemExit as exc:            # argparse: usage errors (2), --help and --version (0)
                code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        os.chdir(here)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    shown = "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line) for w in caught)
    return subprocess.CompletedProcess(["hilbert-hpc", *args], code, out.getvalue(), err.getvalue() + shown)
