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


def on_gpu(x: Any) -> bool:
    """True for a CuPy array or a torch tensor on a CUDA device."""
    return bool(x.is_cuda) if is_tensor(x) else _cupy_array(x)


def is_c_contiguous(x: Any) -> bool:
    """Whether a torch tensor, or a NumPy / CuPy array, is C-contiguous."""
    return bool(x.is_contiguous()) if is_tensor(x) else bool(x.flags.c_contiguous)


def itemsize(x: Any) -> int:
    """Bytes of one element of a torch tensor, or of a NumPy / CuPy array."""
    return int(x.element_size()) if is_tensor(x) else int(x.dtype.itemsize)


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


#: elements per step of count_nonfinite (its temporaries: one byte each, never a copy of the whole output)
NONFINITE_CHUNK = 1 << 24


def count_nonfinite(x: Any) -> int:
    """Number of NaN and infinite values of ``x``, counted where it lives, a block of leading-axis rows at a time.

    Blocked so that the check adds about ``NONFINITE_CHUNK`` bytes to the peak (a whole-tensor
    ``isfinite(x).sum()`` in torch allocates a bool mask and then an int64 copy of it: 4.5x a
    16-bit output); slicing the leading axis never copies the array.
    """
    if x.ndim == 0:
        x = x.reshape(1)
    per_row = max(1, int(np.prod(x.shape[1:])))
    step = max(1, NONFINITE_CHUNK // per_row)
    if is_tensor(x):
        torch = sys.modules["torch"]
        return sum(int(c.numel() - int(torch.count_nonzero(torch.isfinite(c)).item())) for c in x.split(step))
    xp = sys.modules["cupy"] if _cupy_array(x) else np
    return sum(int(x[i:i + step].size - int(xp.count_nonzero(xp.isfinite(x[i:i + step]))))
               for i in range(0, x.shape[0], step))
