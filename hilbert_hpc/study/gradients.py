"""The backward pass of a study case (``pass = "forward+backward"``): the output's gradient and the accuracy
of the gradients.

The loss gradient dO is made like the random inputs, from the seed, on its own
stream (``core.inputs.STREAMS["do"]``, docs/semantics.md section 1), also for
cases that read Q, K, V from a file (``measure.dout_shard``). The gradients of the first call are
compared with float64 on the sampled rows of the forward's accuracy check: the
reference is the exact gradient of those rows alone (``core.reference_backward``),
from the inputs and dO as the backend saw them (``study.reference_inputs``), on
the backend's GPU (CuPy) when it has one, else on the CPU. The error is relative
to the larger of the reference and the root-sum-square of its terms
(``error_sums.relative_errors``, docs/semantics.md section 10): a gradient that
is exactly 0 (a query with no other key to attend to) is measured against the
size of the terms that cancelled, not against its own rounding. On several ranks (the
ring backward, ``distributed.ring_backward``) each rank checks the sampled rows
it owns and the case's first rank adds up the sums: no rank holds the whole
sequence.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hilbert_hpc.core.arrays import RowReader
from hilbert_hpc.core.reference import sample_selected_rows
from hilbert_hpc.core.reference_backward import reference_gradient_check
from hilbert_hpc.study.error_sums import combined, error_sums, relative_errors
from hilbert_hpc.study.reference_inputs import row_source
from hilbert_hpc.study.jobfile import Case
from hilbert_hpc.study.setup import CaseSetup

#: the gradients checked and saved, named after their inputs (``grad_q`` ...)
GRADIENTS = ("q", "k", "v")


def backward_pass(case: Case) -> bool:
    """True when the case also computes (and times) the backward."""
    return case.pass_ == "forward+backward"


def gradient_accuracy(setup: CaseSetup, seed: int, rows: int, grads: list[Any],
                      comm: Any = None) -> dict[str, dict] | None:
    """Error sums of dQ, dK and dV (every head of the sampled rows) against the float64 backward.

    ``grads`` (dQ, dK, dV): this rank's serialized shards of batch element 0.
    Every rank checks the sampled rows it owns against
    ``core.reference_backward`` (the exact gradients of those rows alone, from
    inputs made again from the seed or read from the input file: no rank holds
    the whole sequence), on the backend's GPU (CuPy) when it has one. Returns
    ``{"q": sums, ...}``; on several ranks (``comm`` of more than one rank, every
    rank calls this, collective) the case's first rank returns the sums of all
    ranks and the other ranks None. An input that cannot be read back on one rank
    is raised on every rank.
    """
    from hilbert_hpc.distributed.mpi import SingleProcessComm, collectively

    case, layout, comm = setup.case, setup.layout, comm or SingleProcessComm()
    serial = sample_selected_rows(case.tokens, case.heads, case.patterns, rows, seed)
    mine = serial[layout.owner(serial) == comm.Get_rank()]
    sums = collectively(comm, _local_sums, setup, seed, mine, grads)
    parts = comm.gather(sums, root=0)
    return {name: combined([p[name] for p in parts]) for name in GRADIENTS} if comm.Get_rank() == 0 else None


def _local_sums(setup: CaseSetup, seed: int, serial: np.ndarray, grads: list[Any]) -> dict[str, dict]:
    """Error sums of the gradients of ``serial`` (sorted serialized positions this rank owns; none: empty sums)."""
    if not serial.size:
        return dict.fromkeys(GRADIENTS, error_sums(np.empty(0), np.empty(0)))
    case, layout = setup.case, setup.layout
    xp = _reference_module(setup.backend.on_gpu)
    natural = row_source(case, seed, xp)
    ref, terms = reference_gradient_check(serial, source=lambda name, s: natural(name, layout.natural_of(s)),
                                          heads=case.heads, patterns=case.patterns, causal=case.causal,
                                          scale=case.softmax_scale, xp=xp)
    local = layout.local_rows(serial)
    got = [np.asarray(RowReader(g)[local], dtype=np.float64) for g in grads]
    return {name: error_sums(g, _host(r), _host(t)) for name, g, r, t in zip(GRADIENTS, got, ref, terms)}


def _reference_module(on_gpu: bool) -> Any:
    """CuPy for a GPU backend (its float64 reference takes a fraction of a second where the CPU takes far
    longer), else NumPy."""
    if on_gpu:
        try:
            import cupy

            return cupy
        except ImportError:
            pass
    return np


def _host(x: Any) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else x.get()


def gradient_fields(sums: dict[str, dict] | None) -> dict[str, float]:
    """The record's gradient accuracy (``grad_<t>_max_rel_err``, ``grad_<t>_rel_l2_err``; NaN without a
    backward) from :func:`gradient_accuracy`'s sums."""
    fields = {}
    for name in GRADIENTS:
        s = (sums or {}).get(name)
        max_rel, rel_l2 = relative_errors(s) if s and s["rows"] else (math.nan, math.nan)
        fields.update({f"grad_{name}_max_rel_err": max_rel, f"grad_{name}_rel_l2_err": rel_l2})
    return fields
