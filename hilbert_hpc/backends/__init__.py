"""Compute backends: each turns serialized (N, H, D) arrays into the serialized output.

Every backend is a :class:`~hilbert_hpc.backends.base.Backend` subclass,
registered by name in ``BACKENDS``. Its class answers what it computes in, where
its arrays live and what it needs without importing CuPy or torch
(:func:`find_backend`); :func:`get_backend` also imports them, so that a missing
optional dependency only matters when that backend computes.
"""

from __future__ import annotations

from hilbert_hpc.backends.base import PASSES, Backend, gpu_unusable
from hilbert_hpc.backends.cuda_fp32 import CudaFp32Backend
from hilbert_hpc.backends.cuda_fused import CudaBackend
from hilbert_hpc.backends.cupy_backend import CupyBackend
from hilbert_hpc.backends.flash_peer import FlashPeer
from hilbert_hpc.backends.numpy_backend import NumpyBackend
from hilbert_hpc.backends.torch_peer import TorchPeer
from hilbert_hpc.core.precision import DTYPES, precision
from hilbert_hpc.errors import ConfigError

__all__ = ["BACKENDS", "PASSES", "Backend", "check_backend", "check_pass", "find_backend", "get_backend",
           "gpu_unusable", "require_usable"]

#: every backend by the name jobs and the API give (this order is the one error messages list)
BACKENDS: dict[str, type[Backend]] = {cls.name: cls for cls in (NumpyBackend, TorchPeer, FlashPeer, CupyBackend,
                                                                 CudaFp32Backend, CudaBackend)}


def find_backend(name: str, param: str = "backend") -> Backend:
    """The backend called ``name``, its optional modules not imported (what it is, not yet what computes)."""
    if name not in BACKENDS:
        raise ConfigError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}", param)
    return BACKENDS[name]()


def get_backend(name: str, param: str = "backend") -> Backend:
    """The backend called ``name``, ready to compute; a clear error if unknown or unavailable."""
    return find_backend(name, param).require(param)


def require_usable(name: str, param: str = "backend") -> Backend:
    """The backend ``name``, refused with one line when it cannot run here (a GPU backend without a usable GPU,
    a peer whose module does not import).

    Checked before any work: without it a GPU case fails deep inside CuPy, or
    after minutes of a max-length search. Its :meth:`~Backend.usable` comes first,
    so that a GPU backend without CuPy says it needs an NVIDIA GPU, not only a module.
    """
    be = find_backend(name, param)
    reason = be.usable()
    if reason:
        raise ConfigError(f"backend {name!r} {reason}", param)
    return be.require(param)


def check_backend(dtype: str, backend: str, param: str) -> None:
    """Refuse a (dtype, backend) pair that does not compute: one line naming both and what does."""
    precision(dtype)
    if dtype not in find_backend(backend).dtypes:
        takes = [d for d in DTYPES if d in BACKENDS[backend].dtypes]
        runs_on = [name for name, cls in BACKENDS.items() if dtype in cls.dtypes]
        raise ConfigError(f"backend {backend!r} does not compute in {dtype} (it takes {', '.join(takes)}); "
                          f"dtype {dtype} runs on backend {' or '.join(runs_on)}", param)


def check_pass(pass_: str, backend: str, param: str) -> None:
    """Refuse a pass the backend does not compute (its ``passes``): one line naming both and what does."""
    if pass_ not in find_backend(backend).passes:
        runs_on = [name for name, cls in BACKENDS.items() if pass_ in cls.passes]
        raise ConfigError(f"backend {backend!r} does not compute pass = {pass_!r} (it computes "
                          f"{', '.join(BACKENDS[backend].passes)}); pass = {pass_!r} runs on backend "
                          f"{' or '.join(runs_on)}", param)
