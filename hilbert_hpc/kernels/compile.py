"""The one NVRTC entry of the package: CUDA source text -> cubin or PTX, cached in memory and on disk.

:func:`nvrtc_compile` compiles a program (its text with the headers already inlined, the name expressions
of its template instantiations, NVRTC options and a target such as ``sm_90a``, ``sm_86`` or ``compute_61``)
and returns the binary, the lowered name of every name expression and the NVRTC log. A result is kept

* in memory, for the rest of the process, and
* on disk, in the ``kernels`` folder of :func:`cache_dir` (``$HILBERT_HPC_CACHE_DIR``; else
  ``$XDG_CACHE_HOME/hilbert_hpc``; else ``~/.cache/hilbert_hpc``; ``HILBERT_HPC_CACHE_DIR=off`` turns the
  disk cache off), one file per key, so the ranks of a node and the runs after them load what the first
  one compiled.

The key (:func:`cache_key`) is the SHA-256 of everything that decides the output: the entry format, the
NVRTC version and build (read from the PTX header of an empty program), the program name, the source text,
the name expressions, the options, the target and the output kind. An entry is written under a temporary
name in the same folder and renamed over its final name (``os.replace``), so ranks that start at once never
see a partial file and need no lock (they may all compile; the last rename wins, with the same bytes). An
entry carries its key, size and SHA-256 in a header line; one that does not match (torn, truncated,
edited, another format) is compiled again and replaced, never trusted. A folder that cannot be written
only costs the disk cache: the compile still succeeds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Sequence

#: environment variable naming the cache folder; OFF (any case) disables the disk cache
CACHE_ENV = "HILBERT_HPC_CACHE_DIR"
OFF = "off"
#: sub-folder of the cache folder holding the compiled kernels
KERNEL_FOLDER = "kernels"
#: first bytes of every entry; a new layout changes the number (old entries are then recompiled)
MAGIC = b"hilbert_hpc kernel cache 1\n"
OUTPUTS = ("cubin", "ptx")

_memory: dict[str, "Compiled"] = {}


@dataclass(frozen=True)
class Compiled:
    """What NVRTC produced for one program: the cubin or PTX bytes, the lowered (mangled) name of each name
    expression, and the program log (warnings, ``ptxas -v`` output)."""

    binary: bytes
    lowered: dict[str, str] = field(default_factory=dict)
    log: str = ""


def cache_dir() -> Path | None:
    """The per-user cache folder (``$HILBERT_HPC_CACHE_DIR``, ``$XDG_CACHE_HOME/hilbert_hpc`` or
    ``~/.cache/hilbert_hpc``), or None where ``HILBERT_HPC_CACHE_DIR=off`` disables the disk cache."""
    chosen = os.environ.get(CACHE_ENV, "").strip()
    if chosen.lower() == OFF:
        return None
    if chosen:
        return Path(chosen).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg) if xdg else Path.home() / ".cache") / "hilbert_hpc"


@lru_cache(maxsize=1)
def nvrtc_build() -> str:
    """The NVRTC version and build (``12.9`` and the PTX header lines of an empty program, e.g. "Cuda
    compilation tools, release 12.9, V12.9.86"): two builds of one version can emit different code."""
    from cupy.cuda import nvrtc

    major, minor = nvrtc.getVersion()
    prog = nvrtc.createProgram("", "empty.cu", [], [])
    try:
        nvrtc.compileProgram(prog, [])
        ptx = nvrtc.getPTX(prog)
    finally:
        nvrtc.destroyProgram(prog)
    text = ptx.decode(errors="replace") if isinstance(ptx, bytes) else ptx
    return "\n".join([f"{major}.{minor}", *(line for line in text.splitlines() if line.startswith("//"))])


def cache_key(text: str, name: str, names: Sequence[str], options: Sequence[str], target: str,
              output: str = "cubin") -> str:
    """SHA-256 (hex) of everything that decides what :func:`nvrtc_compile` returns for these arguments."""
    fields = {"magic": MAGIC.decode(), "nvrtc": nvrtc_build(), "name": name, "text": text, "names": list(names),
              "options": list(options), "target": target, "output": output}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def nvrtc_compile(text: str, name: str, names: Sequence[str] = (), options: Sequence[str] = (),
                  target: str = "", output: str = "cubin") -> Compiled:
    """Compile ``text`` (program name ``name``) with NVRTC for ``target`` (``-arch=target`` after
    ``options``), adding the name expressions ``names``; ``output`` 'cubin' (target ``sm_XY``) or 'ptx'.
    Served from the memory cache, else the disk cache, else compiled and stored in both. A compile error
    is a RuntimeError with the NVRTC log."""
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {', '.join(OUTPUTS)}, got {output!r}")
    if not target:
        raise ValueError("target must name an NVRTC architecture, e.g. 'sm_90a' or 'compute_61'")
    names, options = tuple(names), tuple(options)
    key = cache_key(text, name, names, options, target, output)
    if key in _memory:
        return _memory[key]
    folder = cache_dir()
    found = _read_entry(folder / KERNEL_FOLDER / f"{key}.bin", key) if folder is not None else None
    if found is None:
        found = _run_nvrtc(text, name, names, options, target, output)
        if folder is not None:
            _write_entry(folder / KERNEL_FOLDER, key, found)
    _memory[key] = found
    return found


def clear_memory_cache() -> None:
    """Forget what this process compiled or read (the disk cache stays)."""
    _memory.clear()


def device_target(cc: int) -> str:
    """The cubin target for a GPU of compute capability ``cc`` (major * 10 + minor): ``sm_XY`` of the GPU,
    or of the newest architecture this NVRTC knows where the GPU is newer (the choice CuPy makes)."""
    from cupy.cuda import nvrtc

    try:
        newest = max(int(a) for a in nvrtc.getSupportedArchs())
    except (AttributeError, ValueError):      # NVRTC before 11.2 cannot list its architectures
        newest = cc
    return f"sm_{min(int(cc), newest)}"


def _run_nvrtc(text: str, name: str, names: tuple[str, ...], options: tuple[str, ...], target: str,
               output: str) -> Compiled:
    """One NVRTC compile (create, add name expressions, compile, read, destroy)."""
    from cupy.cuda import nvrtc

    prog = nvrtc.createProgram(text, name, [], [])
    try:
        for n in names:
            nvrtc.addNameExpression(prog, n)
        try:
            nvrtc.compileProgram(prog, [*options, f"-arch={target}"])
        except nvrtc.NVRTCError as exc:
            spelled = f" ({', '.join(names)})" if names else ""
            raise RuntimeError(f"{name}{spelled} for {target}: {exc}\n{nvrtc.getProgramLog(prog)}") from None
        binary = nvrtc.getCUBIN(prog) if output == "cubin" else nvrtc.getPTX(prog)
        lowered = {n: nvrtc.getLoweredName(prog, n) for n in names}
        log = nvrtc.getProgramLog(prog)
    finally:
        nvrtc.destroyProgram(prog)
    binary = binary.encode() if isinstance(binary, str) else bytes(binary)
    log = log.decode(errors="replace") if isinstance(log, bytes) else log
    return Compiled(binary, lowered, log)


def _encode(key: str, c: Compiled) -> bytes:
    """An entry: MAGIC, one JSON header line (key, payload size and SHA-256, lowered names, log), the payload."""
    header = {"key": key, "size": len(c.binary), "sha256": hashlib.sha256(c.binary).hexdigest(),
              "lowered": c.lowered, "log": c.log}
    return MAGIC + json.dumps(header).encode() + b"\n" + c.binary


def _decode(data: bytes, key: str) -> Compiled | None:
    """The entry ``data`` if it is complete and belongs to ``key``, else None."""
    if not data.startswith(MAGIC):
        return None
    line, sep, payload = data[len(MAGIC):].partition(b"\n")
    try:
        header = json.loads(line)
    except ValueError:
        return None
    ok = (sep and isinstance(header, dict) and header.get("key") == key and header.get("size") == len(payload)
          and header.get("sha256") == hashlib.sha256(payload).hexdigest()
          and isinstance(header.get("lowered"), dict) and isinstance(header.get("log"), str))
    return Compiled(payload, dict(header["lowered"]), header["log"]) if ok else None


def _read_entry(path: Path, key: str) -> Compiled | None:
    """The valid entry at ``path``, or None (missing, unreadable, torn or another key's)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return _decode(data, key)


def _write_entry(folder: Path, key: str, c: Compiled) -> None:
    """Store ``c`` as ``folder/<key>.bin``: written to a temporary file of the folder, then renamed over
    the entry (atomic); on any OS error the disk cache is skipped and no temporary file stays."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{key}.", suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_encode(key, c))
        os.replace(tmp, folder / f"{key}.bin")
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if not isinstance(exc, OSError):
            raise
