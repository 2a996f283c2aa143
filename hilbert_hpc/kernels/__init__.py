"""Kernel provider: CUDA sources in this folder, compiled once per (variant, head_dim, device).

The FP32 forward kernels all take the same arguments and do the same in-place
log-sum-exp merge. Tensor cores, Hopper (compute capability 9.0 exactly, code for sm_90a):

* ``wgmma`` (``dilated_fwd_wgmma_tf32.cu``): one or two warpgroups x 64 queries, warpgroup MMA
  (wgmma) on split TF32 operands that are split once per tile in shared memory (Q, K, and V
  transposed), P from registers; compiled for sm_90a (``compiled``).

Tensor cores, compute capability 8.0 and newer:

* ``tf32x3`` (``dilated_fwd_tf32x3.cu``): 4 warps x 16 queries, mma.sync TF32
  products of split operands (hi + lo, three products each), FP32 accumulation
  and softmax: FP32-level accuracy at tensor-core speed.

Plain FP32 FMA with sm_60 features only (Pascal and newer):

* ``warp`` (``dilated_fwd_fp32.cu``): each warp owns a few queries; smallest
  shared memory, any row alignment.
* ``tiled64`` / ``tiled128`` (``dilated_fwd_fp32_tiled.cu``): 256 threads
  register-tile a 64- or 128-query x 64-key score block (float4 loads, rows
  aligned to 4 elements); the fast path wherever its shared memory fits.

``select_fp32`` picks the first variant of ``PREFERENCE`` that fits the
device; ``HILBERT_HPC_FP32_KERNEL`` forces one (for benchmarks and tests).
CUDA 13 cannot target compute capability < 7.5: on Pascal install the
``cuda12`` extra (``cupy-cuda12x``).

Every kernel (these, the 16-bit ones of ``half``, the conversions, the Hilbert keys) is a ``Program``
compiled by the one NVRTC entry, :func:`hilbert_hpc.kernels.compile.nvrtc_compile`, to a cubin for its
own target (``sm_90a``) or the device's ``sm_XY``, with an on-disk cache shared by the ranks of a node
(``docs/kernels.md``), and loaded as a module (``load``, ``LoadedKernel``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from hilbert_hpc.kernels.compile import Compiled, device_target, nvrtc_compile

KERNEL_DIR = Path(__file__).resolve().parent
FP32_SOURCE = "dilated_fwd_fp32.cu"
TILED_SOURCE = "dilated_fwd_fp32_tiled.cu"
TF32X3_SOURCE = "dilated_fwd_tf32x3.cu"
WGMMA_SOURCE = "dilated_fwd_wgmma_tf32.cu"
#: head dimensions with an FP32 fast path, and queries per warp of the warp variant
QUERIES_PER_WARP = {32: 8, 64: 8, 96: 4, 128: 4}
HEAD_DIMS = tuple(QUERIES_PER_WARP)
WARPS = 4
KEY_TILE = 32
TILED_THREADS = 256
TILED_KEYS = 64
MMA_THREADS = 128
MMA_QUERIES = 64
MMA_KEYS = 32
#: wgmma variant per head dim: (key tile BK, warpgroups of 64 queries per block, column parts of P V);
#: template arguments of dilated_fwd_wgmma_tf32 (no spills with ptxas for sm_90a, tests/test_kernel_sources.py)
WGMMA_CONFIG = {32: (64, 1, 1), 64: (64, 2, 1), 96: (32, 2, 1), 128: (32, 2, 2)}
WGMMA_ARCH = "sm_90a"
#: FP32 variants, fastest first (measured on an H200, docs/performance.md; wgmma: to be measured)
PREFERENCE = ("wgmma", "tf32x3", "tiled128", "tiled64", "warp")
#: architectures CI compiles every kernel for (NVRTC 12, no GPU needed)
CHECK_ARCHS = ("compute_61", "compute_70", "compute_80", "compute_90")
#: the oldest architecture each source needs (others: compute_61)
SOURCE_MIN_ARCH = {TF32X3_SOURCE: 80, WGMMA_SOURCE: 90}
#: sources checked for their own architecture-specific targets instead of CHECK_ARCHS
SOURCE_ARCHS = {WGMMA_SOURCE: ("compute_90a",)}
OPTIONS = ("-std=c++14",)
#: headers the sources include, inlined by ``source`` (so compile caches see their text)
HEADERS = ("common.cuh", "convert.cuh", "cp_async.cuh", "mma_sync.cuh", "wgmma.cuh", "tma.cuh",
           "attention.cuh")
VARIANT_ENV = "HILBERT_HPC_FP32_KERNEL"
PASCAL_SHARED = 48 * 1024


@dataclass(frozen=True)
class Variant:
    """One FP32 kernel variant for one head dimension: what to compile and how to launch it."""

    variant: str
    head_dim: int
    source: str
    name: str
    threads: int
    block_queries: int
    shared_bytes: int
    #: row offsets must be multiples of this many elements
    align: int
    #: oldest compute capability (major * 10 + minor) it runs on
    min_cc: int = 60
    #: newest compute capability it runs on (architecture-specific code, e.g. sm_90a: 90)
    max_cc: int = 1000
    #: NVRTC target of an architecture-specific variant; None: the device's own sm_XY (``target_of``)
    arch: str | None = None
    #: the variant's configuration (its template arguments after the type and head dim), for its launcher
    config: tuple = ()

    def runs_on(self, cc: int) -> bool:
        """Whether a GPU of compute capability ``cc`` (major * 10 + minor) can run this variant."""
        return self.min_cc <= cc <= self.max_cc


def source(name: str = FP32_SOURCE) -> str:
    """Text of a kernel source file, with this folder's headers inlined."""
    text = (KERNEL_DIR / name).read_text()
    for header in HEADERS:
        text = text.replace(f'#include "{header}"', (KERNEL_DIR / header).read_text())
    return text


def _check_head_dim(head_dim: int) -> None:
    if head_dim not in QUERIES_PER_WARP:
        raise ValueError(f"the fused FP32 kernel supports head_dim in {sorted(QUERIES_PER_WARP)}, got {head_dim}; "
                         f"use backend 'cupy' for other head dimensions")


def kernel_name(head_dim: int) -> str:
    """Template instantiation of the warp FP32 kernel for ``head_dim``."""
    _check_head_dim(head_dim)
    return f"dilated_fwd_fp32<{head_dim},{QUERIES_PER_WARP[head_dim]}>"


def shared_bytes(head_dim: int) -> int:
    """Dynamic shared memory of one block of the warp variant (fits Pascal's 48 KiB for every head_dim)."""
    bq = WARPS * QUERIES_PER_WARP[head_dim]
    return 4 * (bq * head_dim + 2 * KEY_TILE * (head_dim + 1) + bq * KEY_TILE)


def wgmma_shared_bytes(head_dim: int, keys: int, warpgroups: int) -> int:
    """Dynamic shared memory of the wgmma variant (WgmmaSmem in dilated_fwd_wgmma_tf32.cu)."""
    d = head_dim
    q = 64 * warpgroups * d                       # Q hi, Q lo
    kv = keys * d                                 # K hi, K lo, raw K staging
    vt = (d // 8) * (32 * keys + 16) // 4         # V^T hi, V^T lo: 8-row groups padded by 16 bytes
    vs = keys * (d + 4)                           # raw V staging, [key][D + 4]
    return 4 * (2 * q + 3 * kv + 2 * vt + vs)


def variant(name: str, head_dim: int) -> Variant:
    """The launch description of FP32 variant ``name`` for ``head_dim``."""
    _check_head_dim(head_dim)
    if name == "warp":
        return Variant("warp", head_dim, FP32_SOURCE, kernel_name(head_dim), WARPS * 32,
                       WARPS * QUERIES_PER_WARP[head_dim], shared_bytes(head_dim), 1)
    if name in ("tiled64", "tiled128"):
        bq = int(name[5:])
        floats = head_dim * bq + max(head_dim * TILED_KEYS, TILED_KEYS * bq) + TILED_KEYS * head_dim
        return Variant(name, head_dim, TILED_SOURCE, f"dilated_fwd_fp32_tiled<{head_dim},{bq}>", TILED_THREADS,
                       bq, 4 * floats, 4)
    if name == "tf32x3":
        floats = (MMA_QUERIES + 2 * 2 * MMA_KEYS) * (head_dim + 4)   # Q and two K/V tiles, rows padded by 4
        return Variant(name, head_dim, TF32X3_SOURCE, f"dilated_fwd_tf32x3<{head_dim}>", MMA_THREADS,
                       MMA_QUERIES, 4 * floats, 4, 80)
    if name == "wgmma":
        keys, wgs, parts = WGMMA_CONFIG[head_dim]
        return Variant(name, head_dim, WGMMA_SOURCE, f"dilated_fwd_wgmma_tf32<{head_dim},{keys},{wgs},{parts}>",
                       128 * wgs, 64 * wgs, wgmma_shared_bytes(head_dim, keys, wgs), 4, 90, 90, WGMMA_ARCH)
    raise ValueError(f"unknown FP32 kernel variant {name!r}; choose one of {', '.join(PREFERENCE)}")


def all_variants() -> list[Variant]:
    """Every (variant, head_dim) instantiation, for the compile checks."""
    return [variant(v, d) for v in PREFERENCE for d in HEAD_DIMS]


def check_device() -> tuple[int, int]:
    """(compute capability as int, CUDA runtime version); a clear error where the FP32 path cannot run."""
    import cupy

    cc = int(cupy.cuda.Device().compute_capability)
    runtime = cupy.cuda.runtime.runtimeGetVersion()
    if cc < 60:
        raise RuntimeError(f"compute capability {cc / 10:.1f} is below 6.0 (Pascal), the oldest supported GPU")
    if cc < 75 and runtime >= 13000:
        raise RuntimeError(f"CUDA {runtime // 1000}.{runtime % 1000 // 10} cannot run on compute capability "
                           f"{cc / 10:.1f}: install the cuda12 extra (pip install 'hilbert_hpc[cuda12]', cupy-cuda12x)")
    return cc, runtime


def _shared_limit() -> int:
    """Largest dynamic shared memory one block may opt in to on the current device (asked once per device:
    kernel selection runs at every launch)."""
    import cupy

    return _shared_limit_of(cupy.cuda.Device().id)


@lru_cache(maxsize=None)
def _shared_limit_of(device: int) -> int:
    import cupy

    attrs = cupy.cuda.Device(device).attributes
    return int(attrs.get("MaxSharedMemoryPerBlockOptin", attrs.get("MaxSharedMemoryPerBlock", PASCAL_SHARED)))


def _compute_capability() -> int:
    """Compute capability of the current device as major * 10 + minor."""
    import cupy

    return int(cupy.cuda.Device().compute_capability)


def select_fp32(head_dim: int, align: int = 4) -> Variant:
    """The FP32 variant to use on this device for ``head_dim`` and rows aligned to ``align`` elements."""
    forced = os.environ.get(VARIANT_ENV)
    cc = _compute_capability()
    if forced:
        chosen = variant(forced, head_dim)
        if chosen.min_cc > cc:
            raise RuntimeError(f"{VARIANT_ENV}={forced}: needs compute capability {chosen.min_cc / 10:.1f} or newer, "
                               f"this GPU has {cc / 10:.1f}")
        if cc > chosen.max_cc:
            raise RuntimeError(f"{VARIANT_ENV}={forced}: code for {chosen.arch} runs on compute capability "
                               f"{chosen.max_cc / 10:.1f} only, this GPU has {cc / 10:.1f}")
        if chosen.shared_bytes > _shared_limit():
            raise RuntimeError(f"{VARIANT_ENV}={forced}: needs {chosen.shared_bytes} bytes of shared memory per "
                               f"block for head_dim {head_dim}, this GPU allows {_shared_limit()}")
        if align % chosen.align:
            raise RuntimeError(f"{VARIANT_ENV}={forced}: rows are not aligned to {chosen.align} elements")
        return chosen
    limit = _shared_limit()
    for name in PREFERENCE:
        chosen = variant(name, head_dim)
        if chosen.shared_bytes <= limit and align % chosen.align == 0 and chosen.runs_on(cc):
            return chosen
    raise RuntimeError("no FP32 kernel variant fits this GPU")  # pragma: no cover - warp always fits


def compiled(v: Variant) -> Any:
    """The compiled kernel of variant ``v`` on the current device (cached per variant and device).

    Called as ``fn(grid, block, args, shared_mem=bytes)``, like a ``cupy.RawKernel``."""
    import cupy

    return _compiled_on(v, cupy.cuda.Device().id)


@lru_cache(maxsize=None)
def _compiled_on(v: Variant, device: int) -> Any:
    check_device()
    return LoadedKernel(v)


#: NVRTC options of the kernels compiled for the device's own sm_XY: the ones CuPy's RawModule gave them
#: (-ftz=true, --device-as-default-execution-space; its -I folders name no header these sources include), so
#: the cubins are byte for byte what RawModule built (tests/scripts/cubin_digests.py)
DEVICE_OPTIONS = (*OPTIONS, "-ftz=true", "--device-as-default-execution-space")
#: NVRTC options of architecture-specific variants (what CuPy adds for its own compiles: -ftz=true)
ARCH_OPTIONS = (*OPTIONS, "-ftz=true")


@dataclass(frozen=True)
class Program:
    """One NVRTC program: a source of this folder, the name expressions of the template instantiations to
    compile (none for ``extern "C"`` kernels), and the NVRTC options (``-arch`` comes from the target)."""

    source: str
    names: tuple[str, ...] = ()
    options: tuple[str, ...] = DEVICE_OPTIONS


def program(v: Variant) -> Program:
    """The program of variant ``v``: its instantiation, with ARCH_OPTIONS where it has its own target."""
    return Program(v.source, (v.name,), ARCH_OPTIONS if v.arch else DEVICE_OPTIONS)


def build(p: Program, target: str, output: str = "cubin") -> Compiled:
    """``p`` compiled for ``target`` (``sm_90a``, ``sm_86``, ``compute_61`` ...) through the one NVRTC entry
    with its disk cache (:mod:`hilbert_hpc.kernels.compile`)."""
    return nvrtc_compile(source(p.source), p.source, p.names, p.options, target, output)


def target_of(v: Variant, cc: int) -> str:
    """The cubin target of ``v`` on a GPU of compute capability ``cc``: its own (``v.arch``) or the GPU's."""
    return v.arch or device_target(cc)


def compile_cubin(v: Variant, cc: int | None = None) -> tuple[bytes, str, str]:
    """(cubin, lowered kernel name, NVRTC log) of variant ``v`` for its own target (``v.arch``, e.g. sm_90a)
    or, for the others, for compute capability ``cc``.

    CuPy's RawModule picks ``-arch`` from the device (sm_90 on an H100/H200) and cannot target sm_90a, which
    wgmma needs; every variant is therefore compiled here with NVRTC and loaded as a module."""
    if v.arch is None and cc is None:
        raise ValueError(f"{v.name} has no architecture of its own: give the compute capability cc")
    c = build(program(v), target_of(v, cc or 0))
    return c.binary, c.lowered[v.name], c.log


class LoadedProgram:
    """A program's cubin loaded as a module on one device; :meth:`function` by name expression."""

    def __init__(self, p: Program, target: str, device: int):
        import cupy

        built = build(p, target)
        self.program, self.target, self.lowered, self.log = p, target, built.lowered, built.log
        with cupy.cuda.Device(device):
            self.module = cupy.cuda.function.Module()
            self.module.load(built.binary)
        self._functions: dict[str, Any] = {}

    def function(self, name: str) -> Any:
        """The kernel of name expression ``name`` (or of an ``extern "C"`` kernel's own name)."""
        if name not in self._functions:
            self._functions[name] = self.module.get_function(self.lowered.get(name, name))
        return self._functions[name]


def load(p: Program, target: str | None = None) -> LoadedProgram:
    """``p`` loaded on the current device, for ``target`` (default: the device's own sm_XY); cached per
    program, target and device."""
    import cupy

    return _loaded(p, target or device_target(_compute_capability()), cupy.cuda.Device().id)


@lru_cache(maxsize=None)
def _loaded(p: Program, target: str, device: int) -> LoadedProgram:
    return LoadedProgram(p, target, device)


class LoadedKernel:
    """Variant ``v`` loaded on the current device from its cubin: for its own target (``v.arch``) or the
    device's sm_XY; launched like a ``cupy.RawKernel``."""

    def __init__(self, v: Variant):
        from cupy.cuda import driver

        cc = _compute_capability()
        if v.arch is not None and not v.runs_on(cc):
            raise RuntimeError(f"{v.variant} ({v.arch}) cannot run on compute capability {cc / 10:.1f}")
        loaded = load(program(v), target_of(v, cc))
        self.variant, self.lowered, self.log = v, loaded.lowered[v.name], loaded.log
        self.function = loaded.function(v.name)
        if v.shared_bytes > PASCAL_SHARED:
            driver.funcSetAttribute(self.function.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    v.shared_bytes)

    def __call__(self, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0, stream: Any = None) -> None:
        self.function(tuple(grid), tuple(block), tuple(args), shared_mem=shared_mem, stream=stream)
