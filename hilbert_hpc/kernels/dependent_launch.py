"""Programmatic dependent launch (compute capability 9.0+): a kernel launch that may start before the launch
before it on the stream has completed.

A backward call queues several launches one after another (a pattern and head offset each, key chunks, ring hop
pieces); each ends with a last wave that leaves SMs idle, a cost fixed per launch. Launched with the attribute
``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``, the next launch's blocks start on those SMs once every
block of the running launch has executed ``griddepcontrol.launch_dependents``, and each waits
(``griddepcontrol.wait``) for the earlier launch to complete only before it reads what that launch writes
(``backward.cuh``: dK and dV). CuPy launches without attributes, so this calls ``cuLaunchKernelEx`` of the
driver through ``ctypes``, as :mod:`hilbert_hpc.kernels.tma` calls the tensor-map encoder.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

#: CUlaunchAttributeID CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
PROGRAMMATIC_STREAM_SERIALIZATION = 6
#: a kernel argument's NumPy scalar type -> its ctypes type
_CTYPES = {np.dtype(np.uint64): ctypes.c_uint64, np.dtype(np.int64): ctypes.c_int64,
           np.dtype(np.int32): ctypes.c_int32, np.dtype(np.uint32): ctypes.c_uint32,
           np.dtype(np.float32): ctypes.c_float}


class _Attribute(ctypes.Structure):
    """CUlaunchAttribute: the id, padding to 8 bytes, a 64-byte value union."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_ubyte * 64)]


class _Config(ctypes.Structure):
    """CUlaunchConfig."""

    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_bytes", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_Attribute)), ("num_attrs", ctypes.c_uint)]


@lru_cache(maxsize=1)
def _driver() -> tuple[Any, Any]:
    lib = ctypes.CDLL("libcuda.so.1")
    launch = lib.cuLaunchKernelEx
    launch.restype = ctypes.c_int
    launch.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    name = lib.cuGetErrorName
    name.restype = ctypes.c_int
    name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return launch, name


def kernel_arguments(args: Sequence[Any]) -> list[Any]:
    """The ctypes values of kernel arguments given as NumPy scalars (as CuPy takes them)."""
    out = []
    for a in args:
        kind = _CTYPES.get(np.asarray(a).dtype)
        if kind is None:
            raise TypeError(f"kernel argument of type {type(a).__name__} ({np.asarray(a).dtype}) is not supported")
        out.append(kind(a.item() if hasattr(a, "item") else a))
    return out


def launch_dependent(function: int, grid: Sequence[int], block: Sequence[int], args: Sequence[Any],
                     shared_mem: int, stream: int) -> None:
    """Launch CUfunction ``function`` on ``stream`` (a CUstream address, 0: the legacy default stream) so that it
    may start while the launch before it on that stream finishes (programmatic stream serialization)."""
    launch, error_name = _driver()
    values = kernel_arguments(args)
    params = (ctypes.c_void_p * max(1, len(values)))(*(ctypes.addressof(v) for v in values))
    attr = _Attribute(PROGRAMMATIC_STREAM_SERIALIZATION)
    attr.value[0] = 1                                # programmaticStreamSerializationAllowed = 1
    grid3 = (*(int(g) for g in grid), 1, 1)[:3]
    block3 = (*(int(b) for b in block), 1, 1)[:3]
    config = _Config((ctypes.c_uint * 3)(*grid3), (ctypes.c_uint * 3)(*block3), int(shared_mem),
                     ctypes.c_void_p(int(stream) or None), ctypes.pointer(attr), 1)
    rc = launch(ctypes.byref(config), ctypes.c_void_p(int(function)), params, None)
    if rc != 0:
        text = ctypes.c_char_p()
        error_name(rc, ctypes.byref(text))
        raise RuntimeError(f"cuLaunchKernelEx failed: {(text.value or b'').decode() or rc}")
