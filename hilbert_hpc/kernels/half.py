"""Kernel provider for 16-bit inputs (bfloat16, float16): tensor-core kernels with FP32 accumulation,
FP32 softmax and the in-place log-sum-exp merge into a 16-bit output and a float32 log-sum-exp:

* ``wgmma16`` (``dilated_fwd_wgmma_16.cu``): Hopper, compute capability 9.0 (wgmma m64nNk16, code for
  sm_90a compiled by NVRTC to a cubin);
* ``tma16`` (``dilated_fwd_tma_16.cu``): Hopper, head dims 64 and 128, warp-specialized: a producer
  warpgroup loads Q, K and V with the bulk tensor copy engine (TMA, tensor maps from ``kernels/tma.py``)
  into mbarrier-guarded stages, consumer warpgroups run wgmma with the next tile's Q K^T under this
  tile's softmax;
* ``mma16`` (``dilated_fwd_mma_16.cu``): compute capability 8.0 and newer (mma.sync m16n8k16: A100,
  A10/L40S, RTX 30/40, Blackwell), and Hopper when forced.

CuPy has no bfloat16, so the data are held by the caller (torch tensors, or CuPy uint16/float16
arrays) and passed as raw device pointers: ``launch_local_patterns`` takes ints (or anything with
``data_ptr()`` / ``.data.ptr`` / ``__cuda_array_interface__``) plus the (n, H, D) shape and the dtype
name, and launches one kernel per (pattern, head offset) with the same element-offset geometry as
``hilbert_hpc.kernels.launch.local_patterns``.

``select_half`` picks, on compute capability 9.0, the Hopper variant of ``HOPPER_DEFAULT`` for the head dim
(``tma16`` or ``wgmma16``), and ``mma16`` on other GPUs from 8.0; older GPUs get a RuntimeError that names the
dtype and the GPU's compute capability. ``HILBERT_HPC_HALF_KERNEL`` forces a variant or configuration:
``wgmma16`` (the default table), ``wgmma16:BK,WG,VMODE`` (key tile, warpgroups, V mode, e.g.
``wgmma16:64,2,1``), ``tma16``, ``tma16:BK,NC,STAGES,PIPE`` (key tile, consumer warpgroups, stages,
pipelined), ``mma16`` or ``mma16:BK``.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any, Sequence

import numpy as np

from hilbert_hpc.kernels import Program, Variant, compile_cubin, source  # noqa: F401 - compile_cubin, source re-exported
from hilbert_hpc import kernels as _kernels

HALF_SOURCE = "dilated_fwd_wgmma_16.cu"
HALF_ARCH = "sm_90a"
HALF_VARIANT = "wgmma16"
MMA16_SOURCE = "dilated_fwd_mma_16.cu"
MMA16_VARIANT = "mma16"
#: mma16 key tile per head dim (4 warps x 16 queries per block); shared memory 2 (D + 8) (64 + 4 BK) bytes:
#: D = 128 with BK = 32 keeps two blocks per SM on compute capability 8.0 and fits 8.6/8.9's 99 KiB
MMA16_CONFIG = {32: 64, 64: 64, 96: 32, 128: 32}
#: other key tiles compiled in CI (the mma16 kernel has not been timed on a GPU of compute capability 8.x)
MMA16_ALTERNATIVES = {32: [32], 64: [32], 96: [64], 128: [64]}
#: oldest compute capability with bf16/fp16 mma.sync m16n8k16
MMA16_MIN_CC = 80
HALF_ENV = "HILBERT_HPC_HALF_KERNEL"
#: dtype name -> the kernel's 16-bit storage type (template argument T)
HALF_TYPES = {"bfloat16": "bf16_t", "float16": "f16_t"}
#: other spellings accepted for the dtype
_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "f16": "float16", "half": "float16"}
HALF_HEAD_DIMS = (32, 64, 96, 128)
#: per head dim: (key tile BK, warpgroups of 64 queries per block, V mode), template arguments of
#: dilated_fwd_wgmma_16<T, D, BK, WG, VMODE>. V mode 0: V read as MN-major B (wgmma imm-trans-b = 1,
#: no extra work); 1: V transposed once per tile into a K-major V^T buffer (ldmatrix/stmatrix.trans).
#: With BK = 64 and D <= 64 a block is held to 128 registers (two 8-warp blocks per SM). No spills with
#: ptxas for sm_90a (tests/test_kernel16_sources.py). Measured on an H200 (N = 262,144, patterns (2048,1)
#: (4096,2) (8192,4), bf16, ms non-causal / causal): D = 64 (H = 12): (64, 2, 0) 12.54 / 7.98 (two blocks
#: per SM), (128, 2, 1) 15.88 / 9.94, (128, 2, 0) 16.29, (192, 2, 0) 15.71, (64, 1, 0) 20.22 (four blocks),
#: (64, 1, 1) 20.39; D = 128 (H = 8): (128, 2, 0) 16.3-17.3 / 9.9, (128, 2, 1) 17.88, (64, 2, 0) 17.93.
#: D = 32 and 96: not timed yet.
HALF_CONFIG = {32: (128, 2, 0), 64: (64, 2, 0), 96: (128, 2, 0), 128: (128, 2, 0)}
#: other configurations compiled in CI and timed by tests/scripts/wgmma16_probe.py --sweep
HALF_ALTERNATIVES = {
    32: [(128, 2, 1), (64, 2, 0)],
    64: [(128, 2, 1), (128, 2, 0), (192, 2, 0), (64, 1, 0), (64, 1, 1)],
    96: [(128, 2, 1), (64, 2, 0)],
    128: [(128, 2, 1), (64, 2, 0)],
}
TMA_SOURCE = "dilated_fwd_tma_16.cu"
TMA_VARIANT = "tma16"
#: head dims of tma16 (rows of one or two 128-byte swizzle spans)
TMA_HEAD_DIMS = (64, 128)
#: key tiles of tma16 (the wgmma m64nNk16 widths of Wgmma16 in wgmma.cuh)
TMA_KEY_TILES = (32, 64, 96, 128, 192)
#: per head dim: (key tile BK, consumer warpgroups NC, stages, PIPE), template arguments of
#: dilated_fwd_tma_16<T, D, BK, NC, STAGES, PIPE>; PIPE = 1 overlaps the next tile's Q K^T with the softmax.
#: Measured on an H200 (N = 262,144, patterns (2048,1) (4096,2) (8192,4), bf16, ms non-causal / causal,
#: tests/scripts/wgmma16_probe.py --sweep, docs/performance.md): D = 64 (H = 12): (64, 4, 3, 1) 8.34 / 5.68,
#: (96, 3, 3, 1) 8.44 / 5.72, (64, 3, 4, 1) 9.07 / 5.96, (64, 3, 3, 1) 9.03-9.24 / 5.90-6.16, (64, 3, 3, 0)
#: 9.66 / 6.41, (128, 2, 2, 0) 10.09 / 6.75, (128, 2, 2, 1) 10.86 / 7.51, (64, 2, 3, 1) 11.23 / 6.84,
#: (64, 3, 2, 1) 11.24 / 6.92; D = 128 (H = 8): (128, 2, 2, 0) 8.10-8.38 / 5.59, (128, 2, 3, 0) 8.05 / 5.75,
#: (64, 2, 3, 1) 9.23-9.29 / 5.85-6.01, (128, 2, 2, 1) 9.53-9.71 / 6.20-6.36, (64, 2, 4, 0) 9.72 / 6.21,
#: (96, 2, 3, 0) 10.03 / 5.97. Four consumers (640 threads) fit their code in 96 registers without spills.
TMA_CONFIG = {64: (64, 4, 3, 1), 128: (128, 2, 2, 0)}
#: other configurations compiled in CI and timed by tests/scripts/wgmma16_probe.py --sweep
TMA_ALTERNATIVES = {
    64: [(96, 3, 3, 1), (64, 3, 3, 1), (64, 3, 4, 1), (64, 3, 3, 0), (128, 2, 2, 0), (128, 2, 2, 1), (64, 2, 3, 1)],
    128: [(128, 2, 3, 0), (64, 2, 3, 1), (128, 2, 2, 1), (64, 2, 4, 0)],
}
#: the Hopper variant per head dim when none is forced (tma16 has head dims 64 and 128)
HOPPER_DEFAULT = {32: HALF_VARIANT, 64: TMA_VARIANT, 96: HALF_VARIANT, 128: TMA_VARIANT}
#: rows (and every geometry offset) must be multiples of this many elements (16-byte cp.async)
HALF_ALIGN = 8
#: opt-in shared memory per block on compute capability 9.0
HOPPER_SHARED = 227 * 1024


def dtype_name(dtype: Any) -> str:
    """'bfloat16' or 'float16' for a dtype given as a string, a torch dtype or a NumPy dtype."""
    name = str(getattr(dtype, "name", None) or dtype)
    name = name.replace("torch.", "").lower()
    name = _ALIASES.get(name, name)
    if name not in HALF_TYPES:
        raise ValueError(f"the 16-bit kernel takes dtype bfloat16 or float16, got {dtype!r}")
    return name


def half_shared_bytes(head_dim: int, keys: int, warpgroups: int, vmode: int = 0) -> int:
    """Dynamic shared memory of one block (Smem16 in dilated_fwd_wgmma_16.cu): Q, two K/V stages, V^T."""
    tile = 2 * keys * head_dim
    return 2 * 64 * warpgroups * head_dim + 4 * tile + (tile if vmode == 1 else 0)


def half_variant(head_dim: int, dtype: Any, cfg: tuple | None = None) -> Variant:
    """The 16-bit variant for ``head_dim`` and ``dtype`` with configuration ``cfg`` (BK, WG, VMODE)."""
    if head_dim not in HALF_HEAD_DIMS:
        raise ValueError(f"the 16-bit kernel supports head_dim in {list(HALF_HEAD_DIMS)}, got {head_dim}")
    name = dtype_name(dtype)
    keys, wgs, vmode = (int(x) for x in (HALF_CONFIG[head_dim] if cfg is None else cfg))
    if keys % 16 or not 16 <= keys <= 256 or wgs not in (1, 2) or vmode not in (0, 1):
        raise ValueError(f"16-bit kernel configuration (BK, WG, VMODE) = {(keys, wgs, vmode)} is not supported")
    t = HALF_TYPES[name]
    return Variant(HALF_VARIANT, head_dim, HALF_SOURCE, f"dilated_fwd_wgmma_16<{t},{head_dim},{keys},{wgs},{vmode}>",
                   128 * wgs, 64 * wgs, half_shared_bytes(head_dim, keys, wgs, vmode), HALF_ALIGN, 90, 90, HALF_ARCH)


def tma_shared_bytes(head_dim: int, keys: int, consumers: int, stages: int) -> int:
    """Dynamic shared memory of one tma16 block (SmemTma in dilated_fwd_tma_16.cu): Q of the consumer
    warpgroups, the K/V stages, the mbarriers and 1024 bytes that align the base for the 128-byte swizzle."""
    return 2 * 64 * consumers * head_dim + 2 * stages * 2 * keys * head_dim + 8 * (1 + 3 * stages) + 1024


def tma_variant(head_dim: int, dtype: Any, cfg: tuple | None = None, accumulate: bool = False) -> Variant:
    """The tma16 variant for ``head_dim`` and ``dtype`` with configuration ``cfg`` (BK, NC, STAGES, PIPE);
    ``accumulate``: the instantiation that merges into a float32 running output instead of a 16-bit one."""
    if head_dim not in TMA_HEAD_DIMS:
        raise ValueError(f"{TMA_VARIANT} supports head_dim in {list(TMA_HEAD_DIMS)}, got {head_dim}")
    name = dtype_name(dtype)
    keys, nc, stages, pipe = (int(x) for x in (TMA_CONFIG[head_dim] if cfg is None else cfg))
    # key tiles: the wgmma widths of Wgmma16 in wgmma.cuh; NC >= 2: with one consumer the launch bound already gives
    # it more registers than setmaxnreg may raise it to
    if keys not in TMA_KEY_TILES or nc not in (2, 3, 4) or not 2 <= stages <= 8 or pipe not in (0, 1):
        raise ValueError(f"{TMA_VARIANT} configuration (BK, NC, STAGES, PIPE) = {(keys, nc, stages, pipe)} "
                         f"is not supported")
    out = "float" if accumulate else HALF_TYPES[name]
    return Variant(TMA_VARIANT, head_dim, TMA_SOURCE,
                   f"dilated_fwd_tma_16<{HALF_TYPES[name]},{head_dim},{keys},{nc},{stages},{pipe},{out}>",
                   128 * (nc + 1), 64 * nc, tma_shared_bytes(head_dim, keys, nc, stages), HALF_ALIGN, 90, 90,
                   HALF_ARCH, (keys, nc, stages, pipe))


def all_tma_variants() -> list[Variant]:
    """Every tma16 instantiation CI compiles: both dtypes, its head dims, default and alternative configurations,
    and the float32-output instantiation of each default."""
    return [*(tma_variant(d, name, cfg) for name in HALF_TYPES for d in TMA_HEAD_DIMS
              for cfg in dict.fromkeys([TMA_CONFIG[d], *TMA_ALTERNATIVES.get(d, [])])),
            *(tma_variant(d, name, accumulate=True) for name in HALF_TYPES for d in TMA_HEAD_DIMS)]


def mma16_shared_bytes(head_dim: int, keys: int) -> int:
    """Dynamic shared memory of one mma16 block: Q (64 rows) and two K/V stages, rows padded to D + 8."""
    return 2 * (head_dim + 8) * (64 + 4 * keys)


def mma16_variant(head_dim: int, dtype: Any, keys: int | None = None) -> Variant:
    """The mma16 variant (compute capability 8.0+) for ``head_dim`` and ``dtype`` with key tile ``keys``."""
    if head_dim not in HALF_HEAD_DIMS:
        raise ValueError(f"the 16-bit kernel supports head_dim in {list(HALF_HEAD_DIMS)}, got {head_dim}")
    name = dtype_name(dtype)
    keys = MMA16_CONFIG[head_dim] if keys is None else int(keys)
    if keys % 16 or not 16 <= keys <= 128:
        raise ValueError(f"mma16 key tile {keys} is not supported (a multiple of 16 up to 128)")
    return Variant(MMA16_VARIANT, head_dim, MMA16_SOURCE, f"dilated_fwd_mma_16<{HALF_TYPES[name]},{head_dim},{keys}>",
                   128, 64, mma16_shared_bytes(head_dim, keys), HALF_ALIGN, MMA16_MIN_CC)


def all_half_variants() -> list[Variant]:
    """Every wgmma16 instantiation CI compiles: both dtypes, every head dim, the default and alternative
    configurations."""
    out = []
    for name in HALF_TYPES:
        for d in HALF_HEAD_DIMS:
            for cfg in dict.fromkeys([HALF_CONFIG[d], *HALF_ALTERNATIVES.get(d, [])]):
                out.append(half_variant(d, name, cfg))
    return out


def all_mma16_variants() -> list[Variant]:
    """Every mma16 instantiation CI compiles (both dtypes, every head dim, default and alternative key tiles)."""
    return [mma16_variant(d, name, keys) for name in HALF_TYPES for d in HALF_HEAD_DIMS
            for keys in dict.fromkeys([MMA16_CONFIG[d], *MMA16_ALTERNATIVES[d]])]


def _forced_config(forced: str) -> tuple[str, tuple | None]:
    """(variant, configuration) of a HILBERT_HPC_HALF_KERNEL value ('wgmma16' -> the table's, None)."""
    head, _, rest = forced.strip().partition(":")
    sizes = {HALF_VARIANT: 3, TMA_VARIANT: 4, MMA16_VARIANT: 1}
    spelled = {HALF_VARIANT: "BK,WG,VMODE", TMA_VARIANT: "BK,NC,STAGES,PIPE", MMA16_VARIANT: "BK"}
    if head not in sizes:
        raise RuntimeError(f"{HALF_ENV}={forced}: unknown 16-bit kernel variant {head!r}; use "
                           + ", ".join(f"{v} or {v}:{spelled[v]}" for v in sizes))
    if not rest:
        return head, None
    try:
        cfg = tuple(int(x) for x in rest.split(","))
    except ValueError:
        raise RuntimeError(f"{HALF_ENV}={forced}: expected integers after {head}:") from None
    if len(cfg) != sizes[head]:
        raise RuntimeError(f"{HALF_ENV}={forced}: {head} takes {spelled[head]}")
    return head, cfg


def select_half(head_dim: int, dtype: Any) -> Variant:
    """The 16-bit variant for ``head_dim`` and ``dtype`` on this device: wgmma16 on compute capability 9.0,
    mma16 on others from 8.0 (or the one ``HILBERT_HPC_HALF_KERNEL`` forces)."""
    name = dtype_name(dtype)
    cc = _kernels._compute_capability()
    if cc < MMA16_MIN_CC:
        raise RuntimeError(f"dtype {name} needs 16-bit tensor cores (compute capability 8.0 or newer); "
                           f"this GPU has {cc / 10:.1f}")
    forced = os.environ.get(HALF_ENV)
    variant, cfg = (_forced_config(forced) if forced else
                    (HOPPER_DEFAULT.get(head_dim, HALF_VARIANT) if cc == 90 else MMA16_VARIANT, None))
    if variant in (HALF_VARIANT, TMA_VARIANT):
        if cc != 90:
            raise RuntimeError(f"{HALF_ENV}={forced}: {variant} runs on compute capability 9.0 only; "
                               f"this GPU has {cc / 10:.1f}")
        if variant == TMA_VARIANT and head_dim not in TMA_HEAD_DIMS:
            if forced:
                raise RuntimeError(f"{HALF_ENV}={forced}: {TMA_VARIANT} supports head_dim in "
                                   f"{list(TMA_HEAD_DIMS)}, not {head_dim}")
            variant = HALF_VARIANT
        chosen = (tma_variant if variant == TMA_VARIANT else half_variant)(head_dim, name, cfg)
        limit = HOPPER_SHARED
    else:
        chosen = mma16_variant(head_dim, name, cfg[0] if cfg else None)
        limit = _kernels._shared_limit()
    if chosen.shared_bytes > limit:
        raise RuntimeError(f"{chosen.name} needs {chosen.shared_bytes} bytes of shared memory per block; "
                           f"this GPU allows {limit}")
    return chosen


def compiled_half(v: Variant) -> Any:
    """The compiled kernel of ``v`` on the current device (wgmma16, tma16: an sm_90a cubin; mma16: a cubin for
    the device's sm_XY), cached per variant and device; called as ``fn(grid, block, args, shared_mem=bytes)``."""
    return _kernels.compiled(v)


def device_pointer(x: Any) -> int:
    """The device address of ``x``: an int, a torch tensor, a CuPy array or a CUDA-array-interface object."""
    if isinstance(x, (int, np.integer)):
        return int(x)
    if hasattr(x, "data_ptr"):
        return int(x.data_ptr())
    if hasattr(x, "data") and hasattr(x.data, "ptr"):
        return int(x.data.ptr)
    if hasattr(x, "__cuda_array_interface__"):
        return int(x.__cuda_array_interface__["data"][0])
    raise TypeError(f"expected a device pointer (int) or a GPU array, got {type(x).__name__}")


def launch(q: Any, k: Any, v: Any, out: Any, lse: Any, *, qg: tuple, kg: tuple, vg: tuple, lg: tuple,
           segments: int, heads: int, mq: int, mk: int, shift: int | None, scale: float, head_dim: int,
           dtype: Any, og: tuple | None = None, accumulate: bool = False) -> None:
    """One kernel launch over ``segments x heads`` problems (geometry tuples: base, segment, head and row
    strides in elements; q/k/v/out 16-bit, lse float32). ``accumulate`` (tma16 only): ``out`` is a float32
    running output addressed by its own geometry ``og``."""
    if segments == 0 or heads == 0 or mq == 0 or mk == 0:
        return
    if math.gcd(*qg, *kg, *vg, HALF_ALIGN) != HALF_ALIGN:
        raise ValueError(f"the 16-bit kernel needs rows and offsets aligned to {HALF_ALIGN} elements, got "
                         f"q {qg}, k {kg}, v {vg}")
    if not scale > 0:
        raise ValueError(f"the 16-bit kernel needs scale > 0, got {scale}")
    from hilbert_hpc.kernels.launch import query_chunks

    chosen = select_half(head_dim, dtype)
    if accumulate:
        if chosen.variant != TMA_VARIANT:
            raise ValueError(f"a float32 running output needs {TMA_VARIANT}, not {chosen.variant}")
        chosen = tma_variant(head_dim, dtype, chosen.config, accumulate=True)
    fn = compiled_half(chosen)
    if chosen.variant == TMA_VARIANT:
        _launch_tma(fn, chosen, q, k, v, out, lse, qg=qg, kg=kg, vg=vg, lg=lg, og=og, segments=segments,
                    heads=heads, mq=mq, mk=mk, shift=shift, scale=scale)
        return
    ptrs = tuple(np.uint64(device_pointer(x)) for x in (q, k, v, out, lse))
    for qc, lc, mc, sc in query_chunks(qg, lg, mq, shift, chosen.block_queries):
        grid = (segments * heads, -(-mc // chosen.block_queries))
        args = (*ptrs, *(np.int64(x) for x in (*qc, *kg, *vg, *lc)),
                np.int32(heads), np.int32(mc), np.int32(mk), np.int32(sc is not None),
                np.int32(sc or 0), np.float32(scale))
        fn(grid, (chosen.threads,), args, shared_mem=chosen.shared_bytes)


#: most blocks of a one-dimensional grid
MAX_GRID_X = 2**31 - 1


def tma_launch_args(chosen: Variant, pointers: tuple, *, qg: tuple, kg: tuple, vg: tuple, lg: tuple,
                    segments: int, heads: int, mq: int, mk: int, shift: int | None, scale: float,
                    og: tuple | None = None) -> tuple[tuple, tuple, tuple]:
    """(map geometries of Q, K, V; grid; the kernel arguments after the maps pointer) of one tma16 launch
    (pointers: q, k, v, out, lse as ints; the output geometry ``og`` defaults to Q's). Query blocks of one
    problem are adjacent in the 1-D grid."""
    from hilbert_hpc.kernels import tma

    keys = chosen.config[0]
    qptr, kptr, vptr, optr, lptr = (int(x) for x in pointers)
    maps = (tma.map_geometry(qptr, qg, mq, heads, segments, chosen.head_dim, 64),
            tma.map_geometry(kptr, kg, mk, heads, segments, chosen.head_dim, keys),
            tma.map_geometry(vptr, vg, mk, heads, segments, chosen.head_dim, keys))
    qblocks = -(-mq // chosen.block_queries)
    blocks = segments * heads * qblocks
    if blocks > MAX_GRID_X:
        raise ValueError(f"{chosen.variant}: {blocks} blocks exceed a one-dimensional grid")
    args = (np.uint64(optr), np.uint64(lptr), *(np.int64(x) for x in (*(qg if og is None else og), *lg)),
            np.int32(heads), np.int32(qblocks), np.int32(mq), np.int32(mk), np.int32(shift is not None),
            np.int32(shift or 0), np.float32(scale))
    return maps, (blocks,), args


def _launch_tma(fn: Any, chosen: Variant, q: Any, k: Any, v: Any, out: Any, lse: Any, **geometry: Any) -> None:
    import cupy

    from hilbert_hpc.kernels import tma

    pointers = tuple(device_pointer(x) for x in (q, k, v, out, lse))
    maps, grid, args = tma_launch_args(chosen, pointers, **geometry)
    buffer = tma.device_maps(cupy.cuda.Device().id, maps)
    fn(grid, (chosen.threads,), (np.uint64(buffer.data.ptr), *args), shared_mem=chosen.shared_bytes)


def check_half_arrays(q: Any, k: Any, v: Any, out: Any, lse: Any) -> None:
    """Refuse what the 16-bit kernels would misread: arrays that are not C-contiguous, q/k/v/out items that
    are not 2 bytes, an lse that is not float32, base addresses not aligned to 16 bytes (cp.async).
    Raw pointers (ints) are only checked for alignment."""
    for name, x in (("q", q), ("k", k), ("v", v), ("out", out), ("lse", lse)):
        if isinstance(x, (int, np.integer)):
            if int(x) % 16:
                raise ValueError(f"the 16-bit kernel needs {name} aligned to 16 bytes, got address {int(x):#x}")
            continue
        contiguous = x.is_contiguous() if hasattr(x, "is_contiguous") else bool(x.flags.c_contiguous)
        itemsize = x.element_size() if hasattr(x, "element_size") else int(x.dtype.itemsize)
        wanted = 4 if name == "lse" else 2
        if not contiguous or itemsize != wanted:
            raise ValueError(f"the 16-bit kernel needs C-contiguous {name} of {wanted}-byte items"
                             f"{' (float32)' if name == 'lse' else ''}, got {getattr(x, 'dtype', type(x))}"
                             f"{'' if contiguous else ', not contiguous'}")
        if name == "lse" and "float32" not in str(x.dtype):
            raise ValueError(f"the 16-bit kernel needs a float32 lse, got {x.dtype}")
        if device_pointer(x) % 16:
            raise ValueError(f"the 16-bit kernel needs {name} aligned to 16 bytes")


def half_kernels(dtype: Any) -> Any:
    """The fused-kernel provider of the 16-bit kernels for ``dtype`` (:class:`HalfKernels`): local patterns and
    packed ring blocks on 16-bit arrays (held as int16 bits) with a 16-bit output."""
    return HalfKernels(dtype_name(dtype))


def scratch_heads(heads: int) -> int:
    """Heads of one group of the float32 running output of local patterns: half of them (at least one), so the
    scratch is at most 1/4 of the 16-bit Q/K/V/O bytes from 2 heads on. Smaller groups cost launches (measured
    on an H200, the causal bf16 anchor: 5.55 ms rounded per launch; 6.18 / 6.46 / 6.80 / 6.95 ms in groups of
    12 / 6 / 4 / 3 heads); where the scratch does not fit, local patterns round per launch instead."""
    return max(1, heads // 2)


def group_launches(patterns: Sequence, causal: bool, scale: float, n: int, heads: int, head_dim: int, h0: int,
                   h1: int, group: int) -> list[dict]:
    """The launches (keyword arguments of :func:`launch`) of local ``patterns`` for heads ``h0 .. h1 - 1`` of
    (n, heads, head_dim) arrays into a float32 scratch (n, group, head_dim) that holds those heads
    (``fused.local_launches`` restricted to the group, with the scratch's output geometry ``og``)."""
    from hilbert_hpc.kernels.launch import local_launches

    return [dict(kw, accumulate=True)
            for kw in local_launches(patterns, causal, scale, n, heads, head_dim, h0, h1, out_heads=group)]


class HalfKernels:
    """Local patterns and ring blocks of the 16-bit kernels, the provider the ring takes as ``kernels``.

    Ring blocks, and local patterns where tma16 does not run (head dims 32 and 96, other GPUs) or the
    scratch does not fit, merge into the 16-bit running output launch by launch (rounded once per launch).
    With tma16, local patterns merge into a float32 running output kept for a group of heads at a time
    (:func:`scratch_heads`): the group's 16-bit output is widened into it, every local pattern is merged in
    FP32, and the result is rounded to 16 bits once, as the issue's semantics ask (FP32 running output)."""

    def __init__(self, dtype: str) -> None:
        from functools import partial

        from hilbert_hpc.kernels.launch import FusedKernels

        self.dtype = dtype
        self.rounding = FusedKernels(partial(launch, dtype=dtype), check_half_arrays, out_dtype=np.int16)

    def accumulators(self, xp: Any, n: int, heads: int, dv: int, dtype: Any) -> tuple[Any, Any]:
        """Running output zeros (n, H, Dv), 16-bit (int16 bits), and log-sum-exp -inf (n, H) float32."""
        return self.rounding.accumulators(xp, n, heads, dv, dtype)

    def ring_block(self, *args: Any, **kwargs: Any) -> None:
        """A packed ring block merged into the 16-bit running output (``FusedKernels.ring_block``)."""
        self.rounding.ring_block(*args, **kwargs)

    def local_patterns(self, qs: Any, ks: Any, vs: Any, patterns: Sequence, causal: bool, scale: float, out: Any,
                       lse: Any, shape: Sequence[int] | None = None) -> None:
        """Patterns whose segments lie inside these (n, H, D) arrays, merged into ``out`` (16-bit) and ``lse``."""
        n, heads, d = (int(x) for x in (qs.shape if shape is None else shape))
        if d not in TMA_HEAD_DIMS or not patterns or select_half(d, self.dtype).variant != TMA_VARIANT:
            return self.rounding.local_patterns(qs, ks, vs, patterns, causal, scale, out, lse, shape=shape)
        check_half_arrays(qs, ks, vs, out, lse)
        group = scratch_heads(heads)
        scratch = _float32_scratch((n, group, d))
        if scratch is None:                           # at the memory limit: round once per launch instead
            return self.rounding.local_patterns(qs, ks, vs, patterns, causal, scale, out, lse, shape=shape)
        out_ptr, scratch_ptr, lse_ptr = device_pointer(out), device_pointer(scratch), device_pointer(lse)
        for h0 in range(0, heads, group):
            h1 = min(heads, h0 + group)
            first = out_ptr + 2 * h0 * d                 # the group's first element of row 0 (16-bit)
            rows = dict(rows=n, width=(h1 - h0) * d, head_dim=d, l_stride=heads, l_first=h0)
            _convert("widen_16", self.dtype, first, scratch_ptr, lse_ptr, src_stride=heads * d, dst_stride=group * d,
                     **rows)
            for kw in group_launches(patterns, causal, scale, n, heads, d, h0, h1, group):
                launch(qs, ks, vs, scratch, lse, dtype=self.dtype, **kw)
            _convert("narrow_16", self.dtype, scratch_ptr, first, lse_ptr, src_stride=group * d, dst_stride=heads * d,
                     **rows)
        del scratch


def _float32_scratch(shape: tuple) -> Any:
    """An uninitialized float32 array on the current GPU, or None where it does not fit. From torch's caching
    allocator when torch is loaded and its current stream is CuPy's (the 16-bit tensors live there, so the
    memory goes back to them), else from CuPy's pool."""
    import cupy

    torch = sys.modules.get("torch")
    # torch's blocks are reused in the order of torch's current stream: only where the kernels run on it too
    if torch is not None and torch.cuda.current_stream().cuda_stream == cupy.cuda.get_current_stream().ptr:
        try:
            return torch.empty(shape, dtype=torch.float32, device=f"cuda:{cupy.cuda.Device().id}")
        except torch.cuda.OutOfMemoryError:
            return None
    try:
        return cupy.empty(shape, dtype=cupy.float32)
    except cupy.cuda.memory.OutOfMemoryError:
        return None


#: widen_16<T> / narrow_16<T>: the 16-bit output of a group of heads to and from its float32 running output
CONVERT_SOURCE = "convert_16.cu"
CONVERT_THREADS = 256


def convert_names() -> list[str]:
    """Template instantiations of the conversion kernels (both directions, both 16-bit types)."""
    return [f"{kind}<{t}>" for kind in ("widen_16", "narrow_16") for t in HALF_TYPES.values()]


#: the conversion kernels' program (both directions, both 16-bit types), compiled for the device's sm_XY
CONVERT_PROGRAM = Program(CONVERT_SOURCE, tuple(convert_names()))


def _convert(kind: str, dtype: str, src: int, dst: int, lse: int, *, rows: int, width: int, head_dim: int,
             src_stride: int, dst_stride: int, l_stride: int, l_first: int) -> None:
    """``kind`` (widen_16: 16-bit -> float32; narrow_16: back, to nearest even) of ``rows`` rows of ``width``
    elements between device addresses ``src`` and ``dst`` (row strides in elements), for the (row, head)
    pairs whose log-sum-exp (float32 at ``lse``, row stride ``l_stride``, the group's first head ``l_first``)
    is not -inf."""
    fn = _kernels.load(CONVERT_PROGRAM).function(f"{kind}<{HALF_TYPES[dtype]}>")
    steps = rows * (width // 8)
    blocks = max(1, min(-(-steps // CONVERT_THREADS), 1 << 16))
    fn((blocks,), (CONVERT_THREADS,), (np.uint64(src), np.uint64(dst), np.uint64(lse), np.int64(rows),
                                       np.int32(width), np.int32(head_dim), np.int64(src_stride),
                                       np.int64(dst_stride), np.int64(l_stride), np.int64(l_first)))


def launch_local_patterns(q: Any, k: Any, v: Any, patterns: Sequence, causal: bool, scale: float, out: Any,
                          lse: Any, shape: Sequence[int] | None = None, dtype: Any = None) -> None:
    """Patterns whose segments lie inside these (n, H, D) 16-bit arrays, merged into ``out`` (16-bit, same
    layout) and ``lse`` ((n, H) float32, natural log; -inf where nothing was merged yet), in place.

    q, k, v, out, lse: device pointers (ints) to C-contiguous data, or tensors/arrays (their pointers are
    taken); ``shape`` (n, H, D) and ``dtype`` ('bfloat16' / 'float16', or a torch dtype) are read from
    ``q`` when it is a tensor and not given. The geometry is ``hilbert_hpc.kernels.launch.FusedKernels``'.
    """
    if shape is None:
        if not hasattr(q, "shape"):
            raise ValueError("give shape=(n, H, D) with raw pointers")
        shape = tuple(q.shape)
    if dtype is None:
        if not hasattr(q, "dtype"):
            raise ValueError("give dtype='bfloat16' or 'float16' with raw pointers")
        dtype = q.dtype
    half_kernels(dtype).local_patterns(q, k, v, patterns, causal, scale, out, lse, shape=shape)
