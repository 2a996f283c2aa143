"""Error sums of sampled rows against their float64 reference, per rank and combined over ranks.

The forward's accuracy (``measure.local_accuracy``) and each gradient's
(``gradients.gradient_accuracy``) are kept as sums that add across ranks: the
rows compared, the largest absolute error and reference value, and the squared
error and reference. The relative errors a record holds come from the combined
sums.
"""

from __future__ import annotations

import numpy as np

def error_sums(got: np.ndarray, ref: np.ndarray) -> dict:
    """The error sums of rows ``got`` (float64) against ``ref`` (none: all zero)."""
    diff = got - ref
    return {"rows": int(got.shape[0]), "max_abs": float(np.abs(diff).max(initial=0.0)),
            "max_ref": float(np.abs(ref).max(initial=0.0)), "sq_err": float((diff ** 2).sum()),
            "sq_ref": float((ref ** 2).sum())}


def combined(parts: list[dict]) -> dict:
    """Several ranks' error sums as one."""
    return {"rows": sum(p["rows"] for p in parts), "max_abs": max(p["max_abs"] for p in parts),
            "max_ref": max(p["max_ref"] for p in parts), "sq_err": sum(p["sq_err"] for p in parts),
            "sq_ref": sum(p["sq_ref"] for p in parts)}


def relative_errors(sums: dict) -> tuple[float, float]:
    """(max |error| / max |reference|, ||error||_2 / ||reference||_2) of (combined) error sums."""
    tiny = np.finfo(np.float64).tiny
    return (sums["max_abs"] / max(sums["max_ref"], tiny),
            float(np.sqrt(sums["sq_err"]) / max(np.sqrt(sums["sq_ref"]), tiny)))
