"""The backward pass of a study case (``pass = "forward+backward"``): the output's gradient and the accuracy
of the gradients.

The loss gradient dO is made like the random inputs, from the seed, on its own
stream (``core.inputs.STREAMS["do"]``, docs/semantics.md section 1), also for
cases that read Q, K, V from a file. The gradients of the first call are
compared with float64 on the sampled rows of the forward's accuracy check: the
reference is the exact backward (``core.backward``) run on float64 copies of
the inputs and dO as the backend saw them, on the backend's GPU (CuPy) when it
has one, else on the CPU. Only one rank computes the
backward so far (``setup.check_case``), so the whole sequence is here.
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
                      grads: list[Any]) -> dict[str, dict]:
    """Error sums of dQ, dK and dV (every head of the sampled rows) against the float64 backward.

    ``inputs`` (Q, K, V), ``dout`` and ``grads`` (dQ, dK, dV): batch element 0,
    serialized, the whole sequence (one rank). Returns ``{"q": sums, ...}``.
    """
    case, be = setup.case, setup.backend
    serial = sample_selected_rows(case.tokens, case.heads, case.patterns, rows, seed)
    xp = _reference_module(be.on_gpu)
    q, k, v, do = (xp.asarray(np.asarray(be.to_numpy(x), dtype=np.float64)) for x in (*inputs, dout))
    out, lse = local_dilated_forward(q, k, v, case.patterns, case.causal, case.softmax_scale)
    ref = local_dilated_backward(q, k, v, out, lse, do, case.patterns, case.causal, case.softmax_scale)
    del q, k, v, do, out, lse
    return {name: _error_sums(np.asarray(be.to_numpy(g)[serial], dtype=np.float64), _host(r[serial]))
            for name, g, r in zip(GRADIENTS, grads, ref)}


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
