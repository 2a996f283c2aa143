"""Compile every instantiation of the kernel registry for the checked architectures with NVRTC, without a GPU.

``python -m hilbert_hpc.kernels.check`` (CI runs it through the tests) needs
``cupy-cuda12x`` and ``nvidia-cuda-nvrtc-cu12``; NVRTC 12 still targets compute_61.
Every instantiation comes from :func:`hilbert_hpc.kernels.registry.instantiations`: the sources of
families with their own target (``sm_90a``: wgmma, wgmma16, tma16) are checked for it only (PTX for
compute_90a, and each instantiation through ptxas for sm_90a), the others for each of ``CHECK_ARCHS`` their
families run on.
"""

from __future__ import annotations

import sys
from typing import Sequence

from hilbert_hpc.kernels.program import ARCH_OPTIONS, OPTIONS, Program, build
from hilbert_hpc.kernels.registry import FAMILIES, Variant, instantiations

#: architectures CI compiles every kernel for (NVRTC 12, no GPU needed)
CHECK_ARCHS = ("compute_61", "compute_70", "compute_80", "compute_90")
#: sources of the registry's families, each checked as PTX for its architectures (``archs_for``)
TEMPLATE_SOURCES = tuple(dict.fromkeys(f.source for f in FAMILIES.values()))
#: sources without templates (``extern "C"`` kernels)
PLAIN_SOURCES = ("hilbert_keys.cu",)


def helper_programs() -> list[tuple[Program, int]]:
    """(program, oldest compute capability) of the kernels beside the registry's: the 16-bit conversions
    (``sixteen_bit.CONVERT_PROGRAM``, 8.0) and rowsum(dO * O) (``backward.ROW_DOT_PROGRAM``, every GPU)."""
    from hilbert_hpc.kernels.backward import ROW_DOT_PROGRAM
    from hilbert_hpc.kernels.sixteen_bit import CONVERT_PROGRAM

    return [(CONVERT_PROGRAM, 80), (ROW_DOT_PROGRAM, 60)]


def archs_for(name: str) -> tuple[str, ...]:
    """The architectures source ``name`` is checked for: its families' own (e.g. compute_90a for wgmma),
    else those of CHECK_ARCHS its families run on (tensor-core sources: compute_80 and newer)."""
    families = [f for f in FAMILIES.values() if f.source == name]
    own = tuple(dict.fromkeys(f.arch.replace("sm_", "compute_") for f in families if f.arch))
    if own:
        return own
    oldest = min((f.min_cc for f in families), default=0)
    return tuple(a for a in CHECK_ARCHS if int(a.split("_")[1]) >= oldest)


def compile_ptx(arch: str, name: str) -> dict[str, str]:
    """PTX size and lowered name of every instantiation of ``name`` for ``arch`` (e.g. ``compute_61``)."""
    lowered, ptx = compile_templates(arch, name)
    return lowered | {"ptx_bytes": str(len(ptx))}


def compile_templates(arch: str, name: str, names: Sequence[str] | None = None,
                      options: Sequence[str] = OPTIONS) -> tuple[dict[str, str], str]:
    """Lowered name of every instantiation ``names`` of source ``name`` for ``arch`` (default: the registry's
    instantiations of that source), and the PTX text."""
    if names is None:
        names = [v.name for v in instantiations() if v.source == name]
    built = build(Program(name, tuple(names), tuple(options)), arch, "ptx")
    return {n: built.lowered[n] for n in names}, built.binary.decode()


def compile_plain(arch: str, name: str) -> int:
    """Compile a source without templates for ``arch``; returns the PTX size."""
    return len(build(Program(name, (), OPTIONS), arch, "ptx").binary)


def compile_helper(arch: str, p: Program) -> int:
    """Compile a helper program (:func:`helper_programs`) for ``arch``; returns the PTX size."""
    return len(build(Program(p.source, p.names, OPTIONS), arch, "ptx").binary)


def arch_ptxas_report(v: Variant) -> dict[str, object]:
    """Registers, spills and ptxas remarks of an architecture-specific variant (``v.arch``, e.g. the wgmma
    kernel for sm_90a), compiled by NVRTC to a cubin with ``ptxas -v``; no GPU needed."""
    import re

    built = build(Program(v.source, (v.name,), (*ARCH_OPTIONS, "--ptxas-options=-v")), v.arch)
    log, cubin = built.log, built.binary
    regs = re.search(r"Used (\d+) registers", log)
    spill = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return {"registers": int(regs.group(1)) if regs else -1,
            "stack": int(spill.group(1)) if spill else -1,
            "spill_stores": int(spill.group(2)) if spill else -1,
            "spill_loads": int(spill.group(3)) if spill else -1,
            "serialized": "serialized" in log,
            "cubin_bytes": len(cubin),
            "log": log}


def main() -> int:
    """Compile every source for its architectures (CHECK_ARCHS, or its own), and every instantiation with a
    target of its own through ptxas; print one line each."""
    from cupy.cuda import nvrtc

    print(f"NVRTC {'.'.join(map(str, nvrtc.getVersion()))}")
    for arch in dict.fromkeys([*CHECK_ARCHS, *(a for n in TEMPLATE_SOURCES for a in archs_for(n))]):
        for name in (n for n in TEMPLATE_SOURCES if arch in archs_for(n)):
            info = compile_ptx(arch, name)
            print(f"{name} {arch}: ok, {len(info) - 1} instantiations, {info['ptx_bytes']} bytes of PTX")
        for name in (PLAIN_SOURCES if arch in CHECK_ARCHS else ()):
            print(f"{name} {arch}: ok, {compile_plain(arch, name)} bytes of PTX")
        for p, oldest in (helper_programs() if arch in CHECK_ARCHS else ()):
            if int(arch.split("_")[1]) >= oldest:
                print(f"{p.source} {arch}: ok, {len(p.names)} instantiations, {compile_helper(arch, p)} bytes of PTX")
    for v in (v for v in instantiations() if v.arch):
        r = arch_ptxas_report(v)
        print(f"{v.name} {v.arch}: {r['registers']} registers, {r['stack']} bytes stack, "
              f"{r['spill_stores']}/{r['spill_loads']} bytes spill stores/loads, {v.shared_bytes} bytes shared"
              f"{', wgmma serialized' if r['serialized'] else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
