"""Tensor maps for the warp-specialized Hopper kernels: ``tma16``'s Q, K, V (``dilated_fwd_tma_16.cu``), and
``wgmma16_bwd``'s float32 dQ, dK and dV accumulators that it adds to by TMA reduce-add with DQ = 1 and DKV = 1
(:func:`accumulator_map`) and Q and dO tiles that it loads by TMA with LOAD = 1 (:func:`query_tile_map`).

The kernel reads Q, K and V through the bulk tensor copy engine (TMA), which needs a ``CUtensorMap`` per
tensor: a 128-byte descriptor that the CUDA driver builds on the host (``cuTensorMapEncodeTiled``; CuPy
does not wrap it, so it is called through ``ctypes`` from ``libcuda``). Each map covers one launch's
element-offset geometry ``(base, segment, head, row)`` as a 4-D tensor of 16-bit elements with the
dimensions ordered by stride, innermost first: (column, head-in-group, row, segment). One box is one region
of columns (:func:`region_columns`: 64 columns, 128 bytes, the 128-byte swizzle span; 32 columns with the
64-byte swizzle for head dim 32) of ``box_rows`` rows of one head of one segment.

:func:`map_geometry` is plain arithmetic (tested without a GPU against the kernels' pointer formula);
:func:`encode` asks the driver; :func:`device_maps` keeps the maps of a launch (three per launch part) and
the parts' table after them in device memory (the kernel takes a pointer to them), cached per geometry.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

#: CUtensorMapDataType CU_TENSOR_MAP_DATA_TYPE_UINT16 (the raw bits of bf16/fp16; zero fill is +0 in both) and
#: FLOAT32 (the backward's dQ accumulators, added to by TMA reduce-add)
DATA_UINT16, DATA_FLOAT32 = 1, 7
DATA_TYPE_OF_BYTES = {2: DATA_UINT16, 4: DATA_FLOAT32}
#: CUtensorMapInterleave NONE, CUtensorMapL2promotion 256B, CUtensorMapFloatOOBfill NONE
INTERLEAVE_NONE, L2_PROMOTION_256B, OOB_FILL_ZERO = 0, 3, 0
#: CUtensorMapSwizzle of a box row of 128 and 64 bytes
SWIZZLE_OF_ROW_BYTES = {128: 3, 64: 2}
ELEMENT_BYTES = 2
MAP_BYTES = 128


@dataclass(frozen=True)
class MapGeometry:
    """One 4-D tensor map: byte address of element (0, 0, 0, 0), sizes (columns, heads, rows, segments),
    byte strides of heads, rows and segments, the box (columns, 1, rows, 1) and the bytes of an element (2: 16-bit
    raw bits, 4: float32)."""

    address: int
    dims: tuple[int, int, int, int]
    strides: tuple[int, int, int]
    box: tuple[int, int, int, int]
    element_bytes: int = ELEMENT_BYTES

    def element_offset(self, column: int, head: int, row: int, segment: int) -> int:
        """Element offset from the map's address of a coordinate (what the copy engine reads)."""
        byte = (column * self.element_bytes + head * self.strides[0] + row * self.strides[1]
                + segment * self.strides[2])
        return byte // self.element_bytes


def map_geometry(pointer: int, geo: tuple, rows: int, heads: int, segments: int, head_dim: int,
                 box_rows: int, element_bytes: int = ELEMENT_BYTES, box_columns: int | None = None) -> MapGeometry:
    """The tensor map of a tensor of ``element_bytes`` elements (2: 16-bit, 4: float32) at device address
    ``pointer`` with element-offset geometry ``geo = (base, segment, head, row)``: element (column c, head h,
    row j, segment s) is at ``base + s * segment + h * head + j * row + c``. A dimension of size one gets the
    packed stride (the driver wants strides that are multiples of 16 bytes; the kernels' rows already are).
    The box: ``box_columns`` (default :func:`region_columns`) by ``box_rows``."""
    base, seg, head, row = (int(x) for x in geo)
    if min(rows, heads, segments) < 1:
        raise ValueError(f"tensor map of an empty launch: rows {rows}, heads {heads}, segments {segments}")
    eb = int(element_bytes)
    head_b = head * eb if heads > 1 else head_dim * eb
    row_b = row * eb if rows > 1 else head_b * heads
    seg_b = seg * eb if segments > 1 else row_b * rows
    strides = (head_b, row_b, seg_b)
    for what, s in zip(("head", "row", "segment"), strides):
        if s <= 0 or s % 16 or s >= 1 << 40:
            raise ValueError(f"tensor map {what} stride of {s} bytes: must be a positive multiple of 16 below 2^40")
    address = int(pointer) + base * eb
    if address % 16:
        raise ValueError(f"tensor map address {address:#x} is not aligned to 16 bytes")
    if not 1 <= box_rows <= 256:
        raise ValueError(f"tensor map box of {box_rows} rows (1..256)")
    columns = region_columns(head_dim) if box_columns is None else int(box_columns)
    return MapGeometry(address, (head_dim, heads, rows, segments), strides, (columns, 1, box_rows, 1), eb)


def region_columns(head_dim: int) -> int:
    """Columns of one region of a tile (the kernels' ``tma_region_columns``, tma.cuh): 64 (rows of 128 bytes,
    128-byte swizzle), or 32 at head dim 32 (64 bytes, 64-byte swizzle), so that its P V products are 32 columns
    wide, not 64."""
    return 32 if head_dim <= 32 else 64


@lru_cache(maxsize=1)
def _driver() -> Any:
    lib = ctypes.CDLL("libcuda.so.1")
    fn = lib.cuTensorMapEncodeTiled
    fn.restype = ctypes.c_int
    u64p, u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return fn


def encode(g: MapGeometry) -> bytes:
    """The 128 bytes of the CUtensorMap of ``g`` (the swizzle of its box rows: 128 or 64 bytes; zero fill out of
    bounds)."""
    host = np.zeros(MAP_BYTES + 64, dtype=np.uint8)
    start = (-host.ctypes.data) % 64                      # CUtensorMap is 64-byte aligned
    view = host[start:start + MAP_BYTES]
    dims = (ctypes.c_uint64 * 4)(*g.dims)
    strides = (ctypes.c_uint64 * 3)(*g.strides)
    box = (ctypes.c_uint32 * 4)(*g.box)
    ones = (ctypes.c_uint32 * 4)(1, 1, 1, 1)
    rc = _driver()(view.ctypes.data, DATA_TYPE_OF_BYTES[g.element_bytes], 4, g.address, dims, strides, box, ones,
                   INTERLEAVE_NONE, SWIZZLE_OF_ROW_BYTES[g.box[0] * g.element_bytes], L2_PROMOTION_256B,
                   OOB_FILL_ZERO)
    if rc != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed (CUresult {rc}) for {g}")
    return view.tobytes()


@lru_cache(maxsize=256)
def device_maps(device: int, geometries: tuple[MapGeometry, ...], tail: bytes = b"") -> Any:
    """The encoded maps of ``geometries`` one after another in device memory of ``device``, then ``tail`` (a
    CuPy uint8 array, kept alive by this cache as long as the geometry is in use)."""
    import cupy

    data = np.frombuffer(b"".join(encode(g) for g in geometries) + tail, dtype=np.uint8)
    with cupy.cuda.Device(device):
        return cupy.asarray(data)


#: rows of a Q, dO or accumulator box of a backward block: 64 query rows (wgmma16_bwd's query tile of BQ rows is
#: BQ / 64 of them stacked), or the keys of one of its warpgroups
QUERY_TILE_ROWS = 64


def query_tile_map(pointer: int, qg: tuple, rows: int, heads: int, segments: int, head_dim: int) -> MapGeometry:
    """The tensor map of a 16-bit Q or dO of one backward launch (geometry ``qg``, ``rows`` = the launch's mq):
    boxes of one region of columns by QUERY_TILE_ROWS rows, as wgmma16_bwd with LOAD = 1 stages them."""
    return map_geometry(pointer, qg, rows, heads, segments, head_dim, QUERY_TILE_ROWS)


#: an accumulator box a backward block adds at once: columns of one box (128 bytes of float32, the 128-byte swizzle
#: span) and rows (wgmma16_bwd's query tile, or a warpgroup's keys)
ACCUMULATOR_BOX_COLUMNS, ACCUMULATOR_BOX_ROWS = 32, QUERY_TILE_ROWS


def accumulator_map(pointer: int, geo: tuple, rows: int, heads: int, segments: int, head_dim: int) -> MapGeometry:
    """The tensor map of float32 gradient accumulators at device address ``pointer`` of one backward launch: dq
    (addressed like Q: ``geo`` = its ``qg``, ``rows`` = mq), dk or dv (like K or V, ``rows`` = the launch's mk), in
    boxes of ACCUMULATOR_BOX_COLUMNS x ACCUMULATOR_BOX_ROWS."""
    return map_geometry(pointer, geo, rows, heads, segments, head_dim, ACCUMULATOR_BOX_ROWS, element_bytes=4,
                        box_columns=ACCUMULATOR_BOX_COLUMNS)
