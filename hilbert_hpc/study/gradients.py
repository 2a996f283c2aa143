"""The backward pass of a study case (``pass = "forward+backward"``): the output's gradient and the accuracy
of the gradients.

The loss gradient dO is made like the random inputs, from the seed, on its own
stream (``core.inputs.STREAMS["do"]``, docs/semantics.md section 1), also for
cases that read Q, K, V from a file. The gradients of the first call are
compared with float64 on the sampled rows of the forward's accuracy check: the
reference is the exact backward (``core.backward``) run on float64 copies of
the inputs and dO as the backend saw them, on the backend's GPU (CuPy) when it
has one, else on the CPU. On several ranks (the ring backward,
``distributed.ring_backward``) the case's first rank gathers the inputs and dO
and checks every rank's sampled rows.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hilbert_hpc.core.backward import local_dilated_backward
from hilbert_hpc.core.dilated import local_dilated_forward
from hilbert_hpc.core.inputs import random_rows
from hilbert_hpc.core.reference import sample_selected_rows
from hilbert_hpc.study.jobfile import Case
from hilbert_hpc.study.setup import CaseSetup

#: the gradients checked and saved, named after their inputs (``grad_q`` ...)
GRADIENTS = ("q", "k", "v")


def backward_pass(case: Case) -> bool:
    """True when the case also computes (and times) the backward."""
    return case.pass_ == "forward+backward"


def dout_shard(setup: CaseSetup, seed: int, comm: Any, batch_index: int) -> Any:
    """This rank's loss gradient dO of one batch element, serialized, as the backend computes with it."""
    case, layout = setup.case, setup.layout
    positions = batch_index * case.tokens + layout.shard_natural(comm.Get_rank())
    rows = random_rows(seed, "do", positions, case.heads, case.head_dim, setup.precision.generation_dtype())
    return setup.backend.to_device(rows, case.dtype)


def _error_sums(got: np.ndarray, ref: np.ndarray) -> dict:
    """The error sums of one gradient's sampled rows (as ``measure.local_accuracy`` makes them)."""
    diff = got - ref
    return {"rows": int(got.shape[0]), "max_abs": float(np.abs(diff).max(initial=0.0)),
            "max_ref": float(np.abs(ref).max(initial=0.0)), "sq_err": float((diff ** 2).sum()),
            "sq_ref": float((ref ** 2).sum())}


def gradient_accuracy(setup: CaseSetup, seed: int, rows: int, inputs: list[Any], dout: Any,
                      grads: list[Any], comm: Any = None) -> dict[str, dict] | None:
    """Error sums of dQ, dK and dV (every head of the sampled rows) against the float64 backward.

    ``inputs`` (Q, K, V), ``dout`` and ``grads`` (dQ, dK, dV): this rank's
    serialized shards of batch element 0 (the whole sequence on one rank).
    Returns ``{"q": sums, ...}``. On several ranks (``comm`` of more than one
    rank, every rank calls this) the inputs and dO are gathered on the case's
    first rank, which alone computes the reference (the whole sequence, as on one
    rank) and receives each rank's sampled gradient rows; it returns the sums,
    the other ranks None.
    """
    case, be = setup.case, setup.backend
    serial = sample_selected_rows(case.tokens, case.heads, case.patterns, rows, seed)
    ranks = 1 if comm is None else comm.Get_size()
    if ranks == 1:
        got = [np.asarray(be.to_numpy(g)[serial], dtype=np.float64) for g in grads]
        whole = [np.asarray(be.to_numpy(x), dtype=np.float64) for x in (*inputs, dout)]
    else:
        rank, layout = comm.Get_rank(), setup.layout
        owner = layout.owner(serial)
        mine = layout.local_rows(serial[owner == rank])
        parts = comm.gather([np.asarray(be.to_numpy(g)[mine], dtype=np.float64) for g in grads], root=0)
        # the ring's inputs are the backend's ring views (16 bits: their bits); ring_output gives the values back
        whole = [_gather_serialized(comm, layout, np.asarray(be.to_numpy(be.ring_output(x, case.dtype)),
                                                             dtype=np.float64))
                 for x in (*inputs, dout)]
        if rank != 0:
            return None
        got = [np.concatenate([p[i] for p in parts]) for i in range(len(GRADIENTS))]
        serial = np.concatenate([serial[owner == r] for r in range(comm.Get_size())])   # the rows of ``got``
    xp = _reference_module(be.on_gpu)
    q, k, v, do = (xp.asarray(x) for x in whole)
    del whole
    out, lse = local_dilated_forward(q, k, v, case.patterns, case.causal, case.softmax_scale)
    ref = local_dilated_backward(q, k, v, out, lse, do, case.patterns, case.causal, case.softmax_scale)
    del q, k, v, do, out, lse
    return {name: _error_sums(g, _host(r[serial])) for name, g, r in zip(GRADIENTS, got, ref)}


def _gather_serialized(comm: Any, layout: Any, shard: np.ndarray) -> np.ndarray | None:
    """The whole serialized sequence on rank 0 from every rank's ``shard`` (its local rows of ``layout``);
    None elsewhere."""
    shard = np.ascontiguousarray(shard)
    whole = np.empty((comm.Get_size() * shard.shape[0], *shard.shape[1:]), dtype=shard.dtype) \
        if comm.Get_rank() == 0 else None
    comm.Gather(shard, whole, root=0)
    if whole is not None and layout.placement != "contiguous":
        whole = whole[layout.shards.storage(np.arange(whole.shape[0]))]
    return whole


def _reference_module(on_gpu: bool) -> Any:
    """CuPy for a GPU backend (its float64 reference takes a fraction of a second where the CPU takes minutes),
    else NumPy."""
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
    tiny = np.finfo(np.float64).tiny
    fields = {}
    for name in GRADIENTS:
        s = (sums or {}).get(name)
        if not s or not s["rows"]:
            fields.update({f"grad_{name}_max_rel_err": math.nan, f"grad_{name}_rel_l2_err": math.nan})
            continue
        fields[f"grad_{name}_max_rel_err"] = s["max_abs"] / max(s["max_ref"], tiny)
        fields[f"grad_{name}_rel_l2_err"] = float(np.sqrt(s["sq_err"]) / max(np.sqrt(s["sq_ref"]), tiny))
    return fields
