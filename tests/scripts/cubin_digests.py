"""SHA-256 of the cubin of every kernel instantiation, as the package would load it, compiled on the CPU.

    python tests/scripts/cubin_digests.py > digests.txt          # one line: label target sha256

Every instantiation the compile checks know (``registry.instantiations()``, the helper programs of
``kernels.check.helper_programs``: the conversions and rowsum(dO * O), and the Hilbert keys): the
architecture-specific ones for their own target (sm_90a), the others for the device targets below that
they run on. Needs CuPy and NVRTC (cupy-cuda12x, nvidia-cuda-nvrtc-cu12), no GPU.

Two steps. First the package is asked for each cubin and the NVRTC request it makes is recorded (source
text, name expressions, options with ``-arch``): ``--via entry`` (the default where the package has
``kernels.program.build``) through the package's one NVRTC entry, disk cache off; ``--via cupy`` the way the
package built them before that entry existed (``program.compile_cubin`` for sm_90a, CuPy's RawModule for the
device's sm_XY, its module load skipped). Then every recorded request is compiled again, alone, as the
first compile of a fresh process, and that cubin is hashed: NVRTC's code for one request depends on what the
process compiled before it (ptxas schedules some kernels differently after other compiles, e.g. tiled64 for
sm_75), so only cubins compiled from the same process history can be compared byte for byte. Run it on two
commits (or ``--via cupy`` and ``--via entry``) and ``diff`` the outputs: equal lines mean the two make the
same request and get byte-identical cubins. The option sets seen go to stderr.
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

os.environ["HILBERT_HPC_CACHE_DIR"] = "off"                                        # compile, do not read
os.environ["CUPY_CACHE_DIR"] = tempfile.mkdtemp(prefix="cubin-digests-cupy-")   # no cached RawModule cubins
atexit.register(shutil.rmtree, os.environ["CUPY_CACHE_DIR"], True)              # each process removes its own

#: device compute capabilities whose sm_XY cubins are compared (Pascal to Hopper)
DEVICE_CCS = (61, 70, 75, 80, 86, 89, 90)


def programs() -> list[tuple[str, str, tuple[str, ...], tuple[str, ...], str, object]]:
    """(label, source, name expressions, NVRTC options as the package gave them, target, variant or None)."""
    from hilbert_hpc.kernels import program
    from hilbert_hpc.kernels.check import helper_programs
    from hilbert_hpc.kernels.registry import instantiations

    out = []
    for v in instantiations():
        targets = [v.arch] if v.arch else [f"sm_{cc}" for cc in DEVICE_CCS if v.min_cc <= cc <= v.max_cc]
        for t in targets:
            out.append((f"{v.variant}:{v.name}", v.source, (v.name,), tuple(program.OPTIONS), t, v))
    for p, oldest in helper_programs():          # the conversions (8.0+) and rowsum(dO * O) (every GPU)
        label = p.source.removesuffix(".cu") + ":" + "|".join(p.names)
        out += [(label, p.source, p.names, tuple(program.OPTIONS), f"sm_{cc}", None)
                for cc in DEVICE_CCS if cc >= oldest]
    out += [("keys:hilbert_keys", "hilbert_keys.cu", (), ("-std=c++14",), f"sm_{cc}", None) for cc in DEVICE_CCS]
    return out


def via_entry(source: str, names: tuple[str, ...], options: tuple[str, ...], target: str, v: object) -> bytes:
    """The cubin the package loads today: its own Program for the variant, the conversions or the keys."""
    from hilbert_hpc.kernels import program
    from hilbert_hpc.kernels.check import helper_programs
    from hilbert_hpc.tools import gpu_ordering

    helpers = {h.source: h for h, _ in helper_programs()}
    if v is not None:
        p = program.program(v)
    else:
        p = helpers.get(source, gpu_ordering.KEYS_PROGRAM)
    assert p.source == source and (not names or p.names == names), (p, names)
    return program.build(p, target).binary


def via_cupy(source: str, names: tuple[str, ...], options: tuple[str, ...], target: str, v: object) -> bytes:
    """The cubin as the package built it before its one NVRTC entry: ``program.compile_cubin`` for a variant
    with its own target, else CuPy's RawModule for the device's sm_XY (its compile, minus the module load)."""
    from hilbert_hpc.kernels import program

    if v is not None and v.arch:
        return program.compile_cubin(v)[0]
    import cupy  # noqa: F401 - initializes cupy.cuda
    from cupy._core import raw
    from cupy.cuda import compiler

    cc = target.split("_")[1]
    saved = compiler._get_arch, compiler._get_arch_for_options_for_nvrtc
    compiler._get_arch = lambda: cc
    compiler._get_arch_for_options_for_nvrtc = lambda arch=None: (f"-arch=sm_{arch or cc}", "cubin")
    try:
        raw._get_raw_module.__wrapped__(program.source(source), None, options, "nvrtc", False, False, False,
                                        names or None, None)
    except Exception:  # noqa: BLE001 - loading the module needs a GPU; the cubin is built before that
        pass
    finally:
        compiler._get_arch, compiler._get_arch_for_options_for_nvrtc = saved
    return b""


class Recorder:
    """Records the NVRTC requests (text, name expressions, options) whose cubin is read, by wrapping the
    functions of CuPy's NVRTC module that every caller looks up at call time."""

    WRAPPED = ("createProgram", "addNameExpression", "compileProgram", "getCUBIN")

    def __init__(self) -> None:
        from cupy.cuda import nvrtc

        self.nvrtc, self.real = nvrtc, {n: getattr(nvrtc, n) for n in self.WRAPPED}
        self.open: dict[int, dict] = {}
        self.cubins: list[dict] = []

    def __enter__(self) -> "Recorder":
        real = self.real

        def create(text, name, headers, includes):
            prog = real["createProgram"](text, name, headers, includes)
            self.open[prog] = {"text": text, "names": [], "options": []}
            return prog

        def add(prog, name):
            self.open[prog]["names"].append(name)
            return real["addNameExpression"](prog, name)

        def compile_(prog, options):
            self.open[prog]["options"] = list(options)
            return real["compileProgram"](prog, options)

        def cubin(prog):
            self.cubins.append(self.open[prog])
            return real["getCUBIN"](prog)

        for n, fn in zip(self.WRAPPED, (create, add, compile_, cubin)):
            setattr(self.nvrtc, n, fn)
        return self

    def __exit__(self, *exc) -> None:
        for n, fn in self.real.items():
            setattr(self.nvrtc, n, fn)


#: a fresh interpreter that compiles the request on its stdin and prints the cubin's SHA-256: nothing else
#: (no package, no pool worker state) runs before the compile
FRESH = """
import hashlib, json, sys
from cupy.cuda import nvrtc
r = json.load(sys.stdin)
prog = nvrtc.createProgram(r["text"], "kernel.cu", [], [])
for n in r["names"]:
    nvrtc.addNameExpression(prog, n)
nvrtc.compileProgram(prog, r["options"])
print(hashlib.sha256(nvrtc.getCUBIN(prog)).hexdigest())
"""


def fresh_cubin_digest(request: dict) -> str:
    """SHA-256 of the cubin of ``request``, compiled as the first compile of a fresh process."""
    done = subprocess.run([sys.executable, "-c", FRESH], input=json.dumps(request), capture_output=True, text=True,
                          check=True)
    return done.stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--via", choices=("entry", "cupy"), default="entry")
    parser.add_argument("--jobs", type=int, default=2, help="fresh processes at a time")
    args = parser.parse_args()
    from cupy.cuda import nvrtc

    print(f"# NVRTC {'.'.join(map(str, nvrtc.getVersion()))}, via {args.via}", file=sys.stderr)
    rows, requests = programs(), []
    ask = via_entry if args.via == "entry" else via_cupy
    for label, source, names, options, target, v in rows:
        with Recorder() as rec:
            ask(source, names, options, target, v)
        if len(rec.cubins) != 1:
            raise RuntimeError(f"{label} {target}: {len(rec.cubins)} cubins compiled, expected 1")
        requests.append(rec.cubins[0])
    with ThreadPoolExecutor(args.jobs) as pool:
        digests = list(pool.map(fresh_cubin_digest, requests))
    total = hashlib.sha256()
    for (label, _, _, _, target, _), digest in zip(rows, digests):
        total.update(f"{label} {target} {digest}\n".encode())
        print(f"{label} {target} {digest}", flush=True)
    seen = Counter(" ".join(o for o in r["options"] if not o.startswith("-arch=")) for r in requests)
    for options, count in seen.items():
        print(f"# {count} requests with options: {options}", file=sys.stderr)
    print(f"# {len(rows)} cubins, digest of the list {total.hexdigest()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
