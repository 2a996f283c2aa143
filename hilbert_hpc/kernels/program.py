"""Programs of this folder's CUDA sources: their text, their NVRTC options, and loading them on a GPU.

Every kernel (the registry's instantiations, the 16-bit conversions, the Hilbert keys) is a :class:`Program`
compiled by the one NVRTC entry, :func:`hilbert_hpc.kernels.compile.nvrtc_compile`, to a cubin for its own
target (``sm_90a``) or the device's ``sm_XY``, with an on-disk cache shared by the ranks of a node
(``docs/kernels.md``), and loaded as a module (:func:`load`, :func:`compiled`). CUDA 13 cannot target compute
capability < 7.5: on Pascal install the ``cuda12`` extra (``cupy-cuda12x``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from hilbert_hpc.kernels.compile import Compiled, device_target, nvrtc_compile
from hilbert_hpc.kernels.registry import Variant

KERNEL_DIR = Path(__file__).resolve().parent
OPTIONS = ("-std=c++14",)
#: headers the sources include, inlined by ``source`` (so compile caches see their text)
HEADERS = ("common.cuh", "convert.cuh", "cp_async.cuh", "mma_sync.cuh", "wgmma.cuh", "tma.cuh", "mask.cuh",
           "attention.cuh", "backward.cuh")
#: NVRTC options of the kernels compiled for the device's own sm_XY: the ones CuPy's RawModule gave them
#: (-ftz=true, --device-as-default-execution-space; its -I folders name no header these sources include), so
#: the cubins are byte for byte what RawModule built (tests/scripts/cubin_digests.py)
DEVICE_OPTIONS = (*OPTIONS, "-ftz=true", "--device-as-default-execution-space")
#: NVRTC options of architecture-specific variants (what CuPy adds for its own compiles: -ftz=true)
ARCH_OPTIONS = (*OPTIONS, "-ftz=true")
#: shared memory per block every GPU allows without opting in
PASCAL_SHARED = 48 * 1024
#: set to 0 to launch every kernel plainly (no programmatic dependent launch; read when a kernel is loaded)
DEPENDENT_LAUNCH_ENV = "HILBERT_HPC_DEPENDENT_LAUNCH"


def source(name: str) -> str:
    """Text of a kernel source file, with this folder's headers inlined."""
    text = (KERNEL_DIR / name).read_text()
    for header in HEADERS:
        text = text.replace(f'#include "{header}"', (KERNEL_DIR / header).read_text())
    return text


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
    or, for the others, for compute capability ``cc``."""
    if v.arch is None and cc is None:
        raise ValueError(f"{v.name} has no architecture of its own: give the compute capability cc")
    c = build(program(v), target_of(v, cc or 0))
    return c.binary, c.lowered[v.name], c.log


def compute_capability() -> int:
    """Compute capability of the current device as major * 10 + minor."""
    import cupy

    return int(cupy.cuda.Device().compute_capability)


def shared_limit() -> int:
    """Largest dynamic shared memory one block may opt in to on the current device (asked once per device)."""
    import cupy

    return _shared_limit_of(cupy.cuda.Device().id)


@lru_cache(maxsize=None)
def _shared_limit_of(device: int) -> int:
    import cupy

    attrs = cupy.cuda.Device(device).attributes
    return int(attrs.get("MaxSharedMemoryPerBlockOptin", attrs.get("MaxSharedMemoryPerBlock", PASCAL_SHARED)))


def check_device() -> tuple[int, int]:
    """(compute capability as int, CUDA runtime version); a clear error where the kernels cannot run."""
    import cupy

    cc = compute_capability()
    runtime = cupy.cuda.runtime.runtimeGetVersion()
    if cc < 60:
        raise RuntimeError(f"compute capability {cc / 10:.1f} is below 6.0 (Pascal), the oldest supported GPU")
    if cc < 75 and runtime >= 13000:
        raise RuntimeError(f"CUDA {runtime // 1000}.{runtime % 1000 // 10} cannot run on compute capability "
                           f"{cc / 10:.1f}: install the cuda12 extra (pip install 'hilbert_hpc[cuda12]', cupy-cuda12x)")
    return cc, runtime


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

    return _loaded(p, target or device_target(compute_capability()), cupy.cuda.Device().id)


@lru_cache(maxsize=None)
def _loaded(p: Program, target: str, device: int) -> LoadedProgram:
    return LoadedProgram(p, target, device)


def compiled(v: Variant) -> Any:
    """The compiled kernel of variant ``v`` on the current device (cached per variant and device).

    Called as ``fn(grid, block, args, shared_mem=bytes)``, like a ``cupy.RawKernel``."""
    import cupy

    return _compiled_on(v, cupy.cuda.Device().id)


@lru_cache(maxsize=None)
def _compiled_on(v: Variant, device: int) -> Any:
    check_device()
    return LoadedKernel(v)


class LoadedKernel:
    """Variant ``v`` loaded on the current device from its cubin: for its own target (``v.arch``) or the
    device's sm_XY; launched like a ``cupy.RawKernel``, or (``follows``) as a programmatic dependent launch
    where the variant supports it on this GPU (:mod:`hilbert_hpc.kernels.dependent_launch`)."""

    def __init__(self, v: Variant):
        from cupy.cuda import driver

        cc = compute_capability()
        if v.arch is not None and not v.runs_on(cc):
            raise RuntimeError(f"{v.variant} ({v.arch}) cannot run on compute capability {cc / 10:.1f}")
        loaded = load(program(v), target_of(v, cc))
        self.variant, self.lowered, self.log = v, loaded.lowered[v.name], loaded.log
        self.function = loaded.function(v.name)
        #: launches that follow another of the variant's on the stream may overlap its end (compute capability 9.0+)
        self.dependent = v.dependent_launch and cc >= 90 and os.environ.get(DEPENDENT_LAUNCH_ENV, "1") != "0"
        if v.shared_bytes > PASCAL_SHARED:
            driver.funcSetAttribute(self.function.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    v.shared_bytes)

    def __call__(self, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0, stream: Any = None,
                 follows: bool = False) -> None:
        """Launch on ``stream`` (default: CuPy's current stream); ``follows``: the launch before this one on the
        stream is one of the same call whose end this one may overlap (the kernel waits for it where it must)."""
        if follows and self.dependent:
            import cupy

            from hilbert_hpc.kernels.dependent_launch import launch_dependent

            ptr = (stream or cupy.cuda.get_current_stream()).ptr
            launch_dependent(self.function.ptr, grid, block, args, shared_mem, ptr)
            return
        self.function(tuple(grid), tuple(block), tuple(args), shared_mem=shared_mem, stream=stream)
