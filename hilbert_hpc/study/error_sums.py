"""Error sums of sampled rows against their float64 reference, per rank and combined over ranks.

The forward's accuracy (``measure.local_accuracy``) and each gradient's
(``gradients.gradient_accuracy``) are kept as sums that add across ranks: the
rows compared, the largest absolute error and reference value, the squared
error and reference and, for the gradients, the largest root-sum-square of an
element's terms and the sum of all terms' squares (docs/semantics.md, section
10). The relative errors a record holds come from the combined sums: the error
over the larger of the reference and its terms, so that a gradient whose exact
value cancels to (near) zero is measured against the size of what cancelled.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def error_sums(got: np.ndarray, ref: np.ndarray, terms: Any = None) -> dict:
    """The error sums of rows ``got`` (float64) against ``ref`` (none: all zero); ``terms``: the root-sum-square
    of each reference element's terms, like ``ref`` (None: no terms, the reference's own size alone)."""
    diff = got - ref
    terms = np.zeros(0) if terms is None else terms
    return {"rows": int(got.shape[0]), "max_abs": float(np.abs(diff).max(initial=0.0)),
            "max_ref": float(np.abs(ref).max(initial=0.0)), "sq_err": float((diff ** 2).sum()),
            "sq_ref": float((ref ** 2).sum()), "max_terms": float(np.max(terms, initial=0.0)),
            "sq_terms": float((terms ** 2).sum())}


def combined(parts: list[dict]) -> dict:
    """Several ranks' error sums as one."""
    return {"rows": sum(p["rows"] for p in parts), "max_abs": max(p["max_abs"] for p in parts),
            "max_ref": max(p["max_ref"] for p in parts), "sq_err": sum(p["sq_err"] for p in parts),
            "sq_ref": sum(p["sq_ref"] for p in parts), "max_terms": max(p["max_terms"] for p in parts),
            "sq_terms": sum(p["sq_terms"] for p in parts)}


def relative_errors(sums: dict) -> tuple[float, float]:
    """(max |error| / max(max |reference|, max terms), ||error||_2 / max(||reference||_2, ||terms||_2)) of
    (combined) error sums; without terms, relative to the reference alone."""
    tiny = np.finfo(np.float64).tiny
    return (sums["max_abs"] / max(sums["max_ref"], sums["max_terms"], tiny),
            float(np.sqrt(sums["sq_err"]) / max(np.sqrt(sums["sq_ref"]), np.sqrt(sums["sq_terms"]), tiny)))
