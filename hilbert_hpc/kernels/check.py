"""Compile every kernel source for the checked architectures with NVRTC, without a GPU.

``python -m hilbert_hpc.kernels.check`` (CI runs it through the tests) needs
``cupy-cuda12x`` and ``nvidia-cuda-nvrtc-cu12``; NVRTC 12 still targets compute_61.
"""

from __future__ import annotations

import sys

from . import CHECK_ARCHS, FP32_SOURCE, OPTIONS, SOURCE_MIN_ARCH, TF32X3_SOURCE, TILED_SOURCE, all_variants, source

TEMPLATE_SOURCES = (FP32_SOURCE, TILED_SOURCE, TF32X3_SOURCE)


def archs_for(name: str) -> tuple[str, ...]:
    """The architectures of CHECK_ARCHS that source ``name`` targets (tensor-core sources: sm_80+)."""
    return tuple(a for a in CHECK_ARCHS if int(a.split("_")[1]) >= SOURCE_MIN_ARCH.get(name, 0))


def compile_ptx(arch: str, name: str = FP32_SOURCE) -> dict[str, str]:
    """PTX size and lowered name of every instantiation of ``name`` for ``arch`` (e.g. ``compute_61``)."""
    lowered, ptx = compile_templates(arch, name)
    return lowered | {"ptx_bytes": str(len(ptx))}


def compile_templates(arch: str, name: str) -> tuple[dict[str, str], str]:
    """Lowered name of every instantiation of ``name`` for ``arch``, and the PTX text."""
    from cupy.cuda import nvrtc

    prog = nvrtc.createProgram(source(name), name, [], [])
    try:
        names = [v.name for v in all_variants() if v.source == name]
        for n in names:
            nvrtc.addNameExpression(prog, n)
        try:
            nvrtc.compileProgram(prog, [*OPTIONS, f"-arch={arch}"])
        except nvrtc.NVRTCError as exc:
            raise RuntimeError(f"{name} for {arch}: {exc}\n{nvrtc.getProgramLog(prog)}") from None
        ptx = nvrtc.getPTX(prog)
        return {n: nvrtc.getLoweredName(prog, n) for n in names}, ptx.decode() if isinstance(ptx, bytes) else ptx
    finally:
        nvrtc.destroyProgram(prog)


def compile_plain(arch: str, name: str) -> int:
    """Compile a source without templates for ``arch``; returns the PTX size."""
    from cupy.cuda import nvrtc

    prog = nvrtc.createProgram(source(name), name, [], [])
    try:
        try:
            nvrtc.compileProgram(prog, [*OPTIONS, f"-arch={arch}"])
        except nvrtc.NVRTCError as exc:
            raise RuntimeError(f"{name} for {arch}: {exc}\n{nvrtc.getProgramLog(prog)}") from None
        return len(nvrtc.getPTX(prog))
    finally:
        nvrtc.destroyProgram(prog)


PLAIN_SOURCES = ("hilbert_keys.cu",)


def main() -> int:
    """Compile for every architecture in CHECK_ARCHS; print one line each."""
    from cupy.cuda import nvrtc

    print(f"NVRTC {'.'.join(map(str, nvrtc.getVersion()))}")
    for arch in CHECK_ARCHS:
        for name in (n for n in TEMPLATE_SOURCES if arch in archs_for(n)):
            info = compile_ptx(arch, name)
            print(f"{name} {arch}: ok, {len(info) - 1} instantiations, {info['ptx_bytes']} bytes of PTX")
        for name in PLAIN_SOURCES:
            print(f"{name} {arch}: ok, {compile_plain(arch, name)} bytes of PTX")
    return 0


if __name__ == "__main__":
    sys.exit(main())
