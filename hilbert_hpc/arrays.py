"""Helpers for output arrays of any backend (NumPy, CuPy, torch) without copying them whole to the host."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np


def _torch_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _cupy_array(x: Any) -> bool:
    cupy = sys.modules.get("cupy")
    return cupy is not None and isinstance(x, cupy.ndarray)


class RowReader:
    """Indexing it copies just the indexed rows of a (device) array to the host, as a NumPy array."""

    def __init__(self, array: Any) -> None:
        self.array = array

    def __getitem__(self, idx: np.ndarray) -> np.ndarray:
        a = self.array
        if _torch_tensor(a):
            torch = sys.modules["torch"]
            rows = a[torch.as_tensor(np.asarray(idx), device=a.device)]
            return (rows.float() if rows.dtype == torch.bfloat16 else rows).cpu().numpy()
        if _cupy_array(a):
            cupy = sys.modules["cupy"]
            return cupy.asnumpy(a[cupy.asarray(idx)])
        return np.asarray(a[idx])


def concatenate(parts: list[Any]) -> Any:
    """The arrays or tensors ``parts`` joined along their first axis (the only one, as it is, when alone)."""
    if len(parts) == 1:
        return parts[0]
    if _torch_tensor(parts[0]):
        return sys.modules["torch"].cat(parts)
    if _cupy_array(parts[0]):
        return sys.modules["cupy"].concatenate(parts)
    return np.concatenate(parts)


def count_nonfinite(x: Any) -> int:
    """Number of NaN and infinite values of ``x``, counted where it lives (one reduction, one number back)."""
    if _torch_tensor(x):
        torch = sys.modules["torch"]
        return int(x.numel() - int(torch.isfinite(x).sum().item()))
    if _cupy_array(x):
        cupy = sys.modules["cupy"]
        return int(x.size - int(cupy.count_nonzero(cupy.isfinite(x))))
    return int(x.size - np.count_nonzero(np.isfinite(x)))
