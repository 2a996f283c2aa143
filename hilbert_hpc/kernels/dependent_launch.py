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
import struct
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

#: CUlaunchAttributeID CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
PROGRAMMATIC_STREAM_SERIALIZATION = 6
#: a kernel argument's NumPy scalar type -> its struct format character
_FORMATS = {np.uint64: "Q", np.int64: "q", np.int32: "i", np.uint32: "I", np.float32: "f"}


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


@lru_cache(maxsize=64)
def _layout(types: tuple[type, ...]) -> tuple[struct.Struct, tuple[int, ...]]:
    """The packing of kernel arguments of NumPy scalar ``types``: one struct of them side by side (no padding: the
    driver copies each from its own address) and each one's byte offset in it."""
    formats = []
    for kind in types:
        if kind not in _FORMATS:
            raise TypeError(f"kernel argument of type {kind.__name__} is not supported")
        formats.append(_FORMATS[kind])
    offsets = tuple(struct.calcsize("=" + "".join(formats[:i])) for i in range(len(formats)))
    return struct.Struct("=" + "".join(formats)), offsets


def packed_arguments(args: Sequence[Any]) -> tuple[Any, Any]:
    """``kernelParams`` of NumPy scalar kernel arguments for ``cuLaunchKernelEx``: the values packed into one
    buffer (kept alive by the caller, the first item) and the array of their addresses in it; the layout is worked
    out once per sequence of argument types (one conversion a launch, not one ctypes object an argument)."""
    layout, offsets = _layout(tuple(type(a) for a in args))
    buffer = ctypes.create_string_buffer(layout.pack(*args), max(1, layout.size))
    base = ctypes.addressof(buffer)
    return buffer, (ctypes.c_void_p * max(1, len(offsets)))(*(base + off for off in offsets))


def launch_dependent(function: int, grid: Sequence[int], block: Sequence[int], args: Sequence[Any],
                     shared_mem: int, stream: int) -> None:
    """Launch CUfunction ``function`` on ``stream`` (a CUstream address, 0: the legacy default stream) so that it
    may start while the launch before it on that stream finishes (programmatic stream serialization)."""
    launch, error_name = _driver()
    values, params = packed_arguments(args)
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
