"""The dtypes a case can compute in, and what follows from each: host dtype, bytes, tolerance.

``float64`` and ``float32`` compute in their own precision. ``bfloat16`` and
``float16`` keep Q, K, V and the output in 16 bits while scores, softmax, the
running output and the log-sum-exp stay in FP32 (the PyTorch peer: FP32 merge
around 16-bit SDPA). On the host a bfloat16 array is NumPy's ``ml_dtypes.bfloat16``;
inputs are made in float32 and rounded to nearest-even where they reach the
backend, and the float64 accuracy reference starts from the same rounded values.
Which backends compute in a dtype is each backend's ``dtypes`` (``hilbert_hpc.backends``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hilbert_hpc.errors import ConfigError


@dataclass(frozen=True)
class Precision:
    """What one ``dtype`` of a job means."""

    name: str
    #: bytes per element of Q, K, V and the output
    itemsize: int
    #: largest max-relative error against float64 that counts as correct
    tolerance: float
    #: dtype of saved outputs in HDF5 (which has no bfloat16: stored exactly as float32)
    file_dtype: str

    @property
    def sixteen_bit(self) -> bool:
        """True for bfloat16 and float16 (inputs made in float32, rounded where they reach the backend)."""
        return self.itemsize == 2

    def host_dtype(self) -> Any:
        """The NumPy dtype of this precision (``ml_dtypes.bfloat16`` for bfloat16)."""
        if self.name == "bfloat16":
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16)
        return np.dtype(self.name)

    def generation_dtype(self) -> Any:
        """The dtype random inputs are made in (float32 for the 16-bit dtypes)."""
        return np.dtype(np.float32) if self.sixteen_bit else np.dtype(self.name)

    def round(self, x: np.ndarray) -> np.ndarray:
        """Host values as this precision holds them (round to nearest even), returned as float64."""
        with np.errstate(over="ignore"):                 # beyond the range: inf, as the backend sees it
            return np.asarray(x).astype(self.host_dtype()).astype(np.float64)

    def round_on(self, x: Any, xp: Any = np) -> Any:
        """:meth:`round` for arrays of ``xp`` (NumPy or CuPy; CuPy has no bfloat16: float32 values are rounded
        to nearest even on their bits, as the backends' conversion kernels do)."""
        if xp is np:
            return self.round(x)
        if self.name != "bfloat16":
            return x.astype(self.name).astype(np.float64)
        x = x.astype(np.float32)
        bits = x.view(np.uint32)
        bits = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
        return xp.where(xp.isnan(x), x, bits.view(np.float32)).astype(np.float64)    # NaN stays NaN


#: bf16 keeps 8 significant bits (unit roundoff 2^-9), fp16 11 (2^-12): a few roundings of the output
PRECISIONS = {
    "float64": Precision("float64", 8, 1e-10, "float64"),
    "float32": Precision("float32", 4, 1e-4, "float32"),
    "bfloat16": Precision("bfloat16", 2, 2e-2, "float32"),
    "float16": Precision("float16", 2, 4e-3, "float16"),
}
DTYPES = tuple(PRECISIONS)


#: float32's unit roundoff: a score rounded to float32 carries an absolute error up to this times |score|
FLOAT32_UNIT_ROUNDOFF = 2.0 ** -24
#: the float32 path's error budget without large scores (max |err| / max |ref| against float64): output, gradients
FLOAT32_OUTPUT_BUDGET, FLOAT32_GRADIENT_BUDGET = 1e-6, 2e-6


def float32_error_budget(max_abs_score: float) -> dict[str, float]:
    """The float32 path's error budget (docs/semantics.md section 9) for inputs whose largest |score| (``scale q.k``
    over the pairs, or a bound of it) is ``max_abs_score``: the most max |err| / max |ref| against float64 of the
    output (``"output"``: 1e-6 + 2 u max|score|) and of each gradient (``"dq"``, ``"dk"``, ``"dv"``: 2e-6 +
    2 u max|score|), u = 2^-24. The 2 u max|score| term is two float32 roundings of a score (the product q.k, then
    its scaling or the subtraction of the running maximum), each an absolute error up to u |score| that the
    exponential turns into a relative error of the probability: no float32 computation of the scores avoids it."""
    score = 2 * FLOAT32_UNIT_ROUNDOFF * abs(float(max_abs_score))
    return {"output": FLOAT32_OUTPUT_BUDGET + score, "dq": FLOAT32_GRADIENT_BUDGET + score,
            "dk": FLOAT32_GRADIENT_BUDGET + score, "dv": FLOAT32_GRADIENT_BUDGET + score}


def precision(name: str, param: str = "dtype") -> Precision:
    """The Precision called ``name``; a clear error for any other."""
    try:
        return PRECISIONS[name]
    except KeyError:
        raise ConfigError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}", param) from None

