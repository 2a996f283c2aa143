"""Compute backends: each turns serialized (N, H, D) arrays into the serialized output.

A backend is looked up by name; importing its module is deferred so that a
missing optional dependency (torch, cupy) only matters when that backend is used.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol, Sequence

from hilbert_hpc.errors import ConfigError
from hilbert_hpc.core.patterns import Pattern

BACKENDS = {
    "numpy": "hilbert_hpc.backends.numpy_backend",
    "torch": "hilbert_hpc.backends.torch_peer",
    "cupy": "hilbert_hpc.backends.cupy_backend",
    "cuda-fp32": "hilbert_hpc.backends.cuda_fp32",
    "cuda": "hilbert_hpc.backends.cuda_fused",
}


class Backend(Protocol):
    """What every backend module provides."""

    name: str
    #: the per-block attention used by the ring, or None for single-process-only backends
    attend_fn: Any
    #: True when arrays live on a GPU (the ring then needs a device transport)
    on_gpu: bool

    def to_device(self, x: Any, dtype: Any) -> Any:
        """Move a NumPy array to the backend's array type (and device)."""

    def to_numpy(self, x: Any) -> Any:
        """Bring a backend array back to a NumPy array."""

    def synchronize(self) -> None:
        """Wait until queued device work has finished (for timing)."""

    def serialized_attention(self, qs: Any, ks: Any, vs: Any, patterns: Sequence[Pattern], causal: bool,
                             scale: float) -> Any:
        """Dilated attention of serialized (N, H, D) arrays -> serialized output (N, H, Dv)."""


def get_backend(name: str, param: str = "backend") -> Backend:
    """Import and return the backend called ``name``; a clear error if unknown or unavailable."""
    if name not in BACKENDS:
        raise ConfigError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}", param)
    try:
        return importlib.import_module(BACKENDS[name])
    except ImportError as exc:
        raise ConfigError(f"backend {name!r} is not available here ({exc})", param) from None


def require_usable(name: str, param: str = "backend") -> Backend:
    """The backend ``name``, refused with one line when it cannot run here (a GPU backend without a usable GPU).

    Checked before any work: without it a GPU case fails deep inside CuPy, or
    after minutes of a max-length search.
    """
    be = get_backend(name, param)
    if getattr(be, "on_gpu", False) and name != "torch":
        reason = gpu_unusable()
        if reason:
            raise ConfigError(f"backend {name!r} needs an NVIDIA GPU; none is usable here ({reason})", param)
    return be


def gpu_unusable() -> str | None:
    """Why CuPy cannot use a GPU here (no CuPy, no driver, no device), or None when one is usable."""
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
    except ImportError as exc:
        return f"CuPy is not installed: {exc}"
    except Exception as exc:  # noqa: BLE001 - CUDARuntimeError and friends: no driver or no device
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no CUDA driver'}"
    return None if count > 0 else "CUDA sees no device"
