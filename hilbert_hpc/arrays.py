"""Helpers for output arrays of any backend (NumPy, CuPy, torch) without copying them whole to the host."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np


def is_tensor(x: Any) -> bool:
    """True for a torch tensor (without importing torch when it is not loaded)."""
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
        if is_tensor(a):
            torch = sys.modules["torch"]
            return tensor_to_numpy(a[torch.as_tensor(np.asarray(idx), device=a.device)])
        if _cupy_array(a):
            cupy = sys.modules["cupy"]
            return cupy.asnumpy(a[cupy.asarray(idx)])
        return np.asarray(a[idx])


def tensor_to_numpy(t: Any) -> np.ndarray:
    """A host copy of a torch tensor as a NumPy array (bfloat16, which NumPy lacks, as float32: exactly)."""
    import torch

    t = t.detach()
    return (t.float() if t.dtype == torch.bfloat16 else t).cpu().numpy()


def concatenate(parts: list[Any]) -> Any:
    """The arrays or tensors ``parts`` joined along their first axis (the only one, as it is, when alone)."""
    if len(parts) == 1:
        return parts[0]
    if is_tensor(parts[0]):
        return sys.modules["torch"].cat(parts)
    if _cupy_array(parts[0]):
        return sys.modules["cupy"].concatenate(parts)
    return np.concatenate(parts)


def count_nonfinite(x: Any) -> int:
    """Number of NaN and infinite values of ``x``, counted where it lives (one reduction, one number back)."""
    if is_tensor(x):
        torch = sys.modules["torch"]
        return int(x.numel() - int(torch.isfinite(x).sum().item()))
    if _cupy_array(x):
        cupy = sys.modules["cupy"]
        return int(x.size - int(cupy.count_nonzero(cupy.isfinite(x))))
    return int(x.size - np.count_nonzero(np.isfinite(x)))
