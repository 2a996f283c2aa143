"""SHA-256 of the cubin of every kernel instantiation, as the package would load it, compiled on the CPU.

    python tests/scripts/cubin_digests.py > digests.txt          # one line: label target sha256

Every instantiation the compile checks know (``kernels.all_variants``, ``half.all_half_variants``,
``all_tma_variants``, ``all_mma16_variants``, the conversion kernels and the Hilbert keys): the
architecture-specific ones for their own target (sm_90a), the others for the device targets below that
they run on. Needs CuPy and NVRTC (cupy-cuda12x, nvidia-cuda-nvrtc-cu12), no GPU.

``--via entry`` (the default where the package has ``kernels.build``) compiles through the package's one
NVRTC entry with the disk cache off; ``--via cupy`` compiles the variants without an architecture of their
own the way the package did before that entry existed, through CuPy's RawModule (its NVRTC options, for the
device's sm_XY; the module load, which needs a GPU, is skipped). Run both, or run it on two commits, and
``diff`` the outputs: equal lines mean byte-identical cubins.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile

os.environ["HILBERT_HPC_CACHE_DIR"] = "off"                                        # compile, do not read
os.environ["CUPY_CACHE_DIR"] = tempfile.mkdtemp(prefix="cubin-digests-cupy-")   # no cached RawModule cubins

#: device compute capabilities whose sm_XY cubins are compared (Pascal to Hopper)
DEVICE_CCS = (61, 70, 75, 80, 86, 89, 90)
#: oldest compute capability of the conversion kernels (bf16 arithmetic, used with the 16-bit kernels)
CONVERT_MIN_CC = 80


def programs() -> list[tuple[str, str, tuple[str, ...], tuple[str, ...], str, object]]:
    """(label, source, name expressions, NVRTC options as the package gave them, target, variant or None)."""
    from hilbert_hpc import kernels
    from hilbert_hpc.kernels import half

    out = []
    variants = [*kernels.all_variants(), *half.all_half_variants(), *half.all_tma_variants(),
                *half.all_mma16_variants()]
    for v in variants:
        targets = [v.arch] if v.arch else [f"sm_{cc}" for cc in DEVICE_CCS if v.min_cc <= cc <= v.max_cc]
        for t in targets:
            out.append((f"{v.variant}:{v.name}", v.source, (v.name,), tuple(kernels.OPTIONS), t, v))
    convert = tuple(half.convert_names())
    out += [("convert:" + "|".join(convert), half.CONVERT_SOURCE, convert, tuple(kernels.OPTIONS), f"sm_{cc}", None)
            for cc in DEVICE_CCS if cc >= CONVERT_MIN_CC]
    out += [("keys:hilbert_keys", "hilbert_keys.cu", (), ("-std=c++14",), f"sm_{cc}", None) for cc in DEVICE_CCS]
    return out


def via_entry(source: str, names: tuple[str, ...], target: str, v: object) -> bytes:
    """The cubin the package loads today: its own Program for the variant, the conversions or the keys."""
    from hilbert_hpc import gpu_ordering, kernels
    from hilbert_hpc.kernels import half

    if v is not None:
        program = kernels.program(v)
    elif source == half.CONVERT_SOURCE:
        program = half.CONVERT_PROGRAM
    else:
        program = gpu_ordering.KEYS_PROGRAM
    assert program.source == source and (not names or program.names == names), (program, names)
    return kernels.build(program, target).binary


def via_cupy(source: str, names: tuple[str, ...], options: tuple[str, ...], target: str, v: object) -> bytes:
    """The cubin as the package built it before its one NVRTC entry: ``kernels.compile_cubin`` for a variant
    with its own target, else CuPy's RawModule for the device's sm_XY (its compile, minus the module load)."""
    from hilbert_hpc import kernels

    if v is not None and v.arch:
        return kernels.compile_cubin(v)[0]
    import cupy  # noqa: F401 - initializes cupy.cuda
    from cupy._core import raw
    from cupy.cuda import compiler

    real, captured = compiler.nvrtc, []

    class Capture:
        def __getattr__(self, name):
            return getattr(real, name)

        def getCUBIN(self, prog):  # noqa: N802 - NVRTC's spelling
            captured.append(real.getCUBIN(prog))
            return captured[-1]

    cc = target.split("_")[1]
    saved = compiler._get_arch, compiler._get_arch_for_options_for_nvrtc
    compiler._get_arch = lambda: cc
    compiler._get_arch_for_options_for_nvrtc = lambda arch=None: (f"-arch=sm_{arch or cc}", "cubin")
    compiler.nvrtc = Capture()
    try:
        raw._get_raw_module.__wrapped__(kernels.source(source), None, options, "nvrtc", False, False, False,
                                        names or None, None)
    except Exception:  # noqa: BLE001 - loading the module needs a GPU; the cubin is built before that
        pass
    finally:
        compiler.nvrtc = real
        compiler._get_arch, compiler._get_arch_for_options_for_nvrtc = saved
    if not captured:
        raise RuntimeError(f"CuPy built no cubin for {source} {names} {target}")
    return captured[-1]


def main() -> int:
    from hilbert_hpc import kernels

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--via", choices=("entry", "cupy"), default="entry" if hasattr(kernels, "build") else "cupy")
    args = parser.parse_args()
    from cupy.cuda import nvrtc

    print(f"# NVRTC {'.'.join(map(str, nvrtc.getVersion()))}, via {args.via}", file=sys.stderr)
    total = hashlib.sha256()
    rows = programs()
    for label, source, names, options, target, v in rows:
        cubin = via_entry(source, names, target, v) if args.via == "entry" else via_cupy(source, names, options,
                                                                                         target, v)
        digest = hashlib.sha256(cubin).hexdigest()
        total.update(f"{label} {target} {digest}\n".encode())
        print(f"{label} {target} {digest}", flush=True)
    print(f"# {len(rows)} cubins, digest of the list {total.hexdigest()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
