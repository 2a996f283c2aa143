"""The inputs of the float64 references, row by row, as the backend saw them.

Random inputs are made again from the seed (counter-based: any rows, on any
rank, on the host or a GPU give the same values); inputs of an input file are
read again; the loss gradient dO is always made from the seed. Rows are rounded
to the case's dtype, so a 16-bit reference starts from the backend's values.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from hilbert_hpc.core.inputs import random_rows
from hilbert_hpc.core.precision import precision
from hilbert_hpc.distributed.datafile import read_rows
from hilbert_hpc.study.jobfile import Case

#: (tensor name: "q", "k", "v" or "do"; natural positions of batch element 0) -> rows (n, H, D) in float64
RowSource = Callable[[str, np.ndarray], Any]


def row_source(case: Case, seed: int, xp: Any = np) -> RowSource:
    """The rows of natural positions of batch element 0 as the backend sees them, in float64 arrays of ``xp``
    (NumPy, or CuPy where the reference runs on the GPU)."""
    prec = precision(case.dtype)

    def source(name: str, natural: np.ndarray) -> Any:
        if case.input and name != "do":
            return xp.asarray(prec.round(read_rows(case.input, name, 0, natural, np.float64)))
        made = random_rows(seed, name, natural, case.heads, case.head_dim, prec.generation_dtype(), xp)
        return prec.round_on(made, xp)

    return source
