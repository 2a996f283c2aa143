"""MPI bootstrap: the world communicator, node-local rank, GPU binding, abort on any rank's failure.

MPI is initialized only by commands that need it (``run``, ``bandwidth``); when
mpi4py is missing a single-process communicator stands in, so the CPU package
works without an MPI library.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any, Callable, Mapping

from hilbert_hpc.errors import UserError

from hilbert_hpc.core import threads

LOCAL_RANK_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "MPI_LOCAL_RANK",
                        "PMI_LOCAL_RANK")


class SingleProcessComm:
    """The subset of an mpi4py communicator used here, for one process without MPI."""

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py spelling
        return 0

    def Get_size(self) -> int:  # noqa: N802
        return 1

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return obj

    def gather(self, obj: Any, root: int = 0) -> list:
        return [obj]

    def allgather(self, obj: Any) -> list:
        return [obj]

    def allreduce(self, obj: Any, op: Any = None) -> Any:
        return obj

    def Barrier(self) -> None:  # noqa: N802
        return None

    def Abort(self, code: int = 1) -> None:  # noqa: N802
        os._exit(code)


def world() -> Any:
    """``MPI.COMM_WORLD`` (initializing MPI), or a single-process stand-in without mpi4py.

    Collective on its first call: each rank then limits its BLAS/OpenMP threads to its share of the
    node's cores (:func:`limit_rank_threads`).
    """

    try:
        from mpi4py import MPI
    except ImportError:
        comm = SingleProcessComm()
    else:
        comm = MPI.COMM_WORLD
    limit_rank_threads(comm)
    return comm


def local_rank(comm: Any) -> tuple[int, str]:
    """Node-local rank and where it came from (launcher variable, else a shared-memory split)."""
    for var in LOCAL_RANK_VARIABLES:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var]), var
    if isinstance(comm, SingleProcessComm):
        return 0, "single process"
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_rank(), "COMM_TYPE_SHARED split"
    finally:
        node.Free()


def node_allgather(comm: Any, obj: Any) -> list:
    """Collective: ``obj`` of every rank of ``comm`` on this node, in rank order (a shared-memory split)."""
    if isinstance(comm, SingleProcessComm):
        return [obj]
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.allgather(obj)
    finally:
        node.Free()


def ranks_per_node(comm: Any) -> int:
    """How many ranks of ``comm`` share this node (collective: a shared-memory split)."""
    return len(node_allgather(comm, None))


def bind_gpu(comm: Any) -> tuple[int, str]:
    """Select GPU ``local_rank mod visible GPUs`` for this rank (CuPy and, if loaded, torch)."""
    lrank, source = local_rank(comm)
    try:
        import cupy

        ndev = cupy.cuda.runtime.getDeviceCount()
        dev = lrank % ndev
        cupy.cuda.Device(dev).use()
    except ImportError:
        import torch

        ndev = torch.cuda.device_count()
        dev = lrank % ndev
    if "torch" in sys.modules:
        sys.modules["torch"].cuda.set_device(dev)
    return dev, f"local rank {lrank} ({source}) of {ndev} visible GPU(s)"


def abort_on_exception(comm: Any) -> None:
    """Make an unhandled exception on any rank print once for that rank and abort every rank.

    Only the end of the program is a crash: Python calls the hook with no frame
    left running. A call while code still runs is a report of an error the
    program goes on from (Cython prints an error of a finalizer, such as h5py
    closing a dataset, through the hook, then hands it to ``sys.unraisablehook``,
    which says it was ignored): it aborts nothing.
    """
    if comm.Get_size() == 1:
        return
    previous: Callable = sys.excepthook

    def hook(exc_type, exc, tb) -> None:
        if sys._getframe().f_back is not None:
            return
        if issubclass(exc_type, KeyboardInterrupt):
            previous(exc_type, exc, tb)
        else:
            text = "".join(traceback.format_exception(exc_type, exc, tb))
            sys.stderr.write(f"hilbert-hpc: rank {comm.Get_rank()}: internal error, aborting all ranks\n{text}")
        sys.stderr.flush()
        comm.Abort(1)

    sys.excepthook = hook


def agree(comm: Any, error: Exception | None) -> Exception | None:
    """Collective: the first rank's error (by rank order) if any rank had one, on every rank."""
    return agree_boundary(comm, 0, error)[1]


def collectively(comm: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """Collective: ``fn(*args)`` on every rank; if it raised a UserError on any rank, raise it on all of them
    (before any rank waits in the next collective)."""
    error, value = None, None
    try:
        value = fn(*args)
    except UserError as exc:
        error = exc
    error = agree(comm, error)
    if error is not None:
        raise error
    return value


def agree_boundary(comm: Any, signum: int, error: Exception | None) -> tuple[int, Exception | None]:
    """Collective at a case boundary: the largest stop signal any rank received, and the first rank's error."""
    items = comm.allgather((int(signum or 0), None if error is None else (
        type(error).__name__, getattr(error, "message", str(error)), getattr(error, "param", None))))
    first = next((rank for rank, (_, item) in enumerate(items) if item is not None), None)
    if first is None:
        agreed = None
    elif first == comm.Get_rank():
        agreed = error                      # the first error is this rank's own: keep its type
    else:
        agreed = _rebuild(items[first][1])
    return max(s for s, _ in items), agreed


def _rebuild(item: tuple) -> Exception:
    from hilbert_hpc.errors import ConfigError

    _, message, param = item
    return ConfigError(message, param)


def env_rank() -> int | None:
    """This process's world rank as the launcher set it (None when no launcher variable is set)."""
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return None


def plan_threads(comm: Any, environ: Mapping[str, str] | None = None) -> threads.ThreadPlan:
    """Collective over ``comm``: this rank's thread plan, the node's ranks found by a shared-memory split."""
    setting = threads.user_setting(os.environ if environ is None else environ)   # refuses a bad value before the collective
    mine = threads.affinity()
    masks = [frozenset(m) for m in node_allgather(comm, sorted(mine))]
    return threads.decide(mine, masks, setting)


def limit_rank_threads(comm: Any) -> threads.ThreadPlan:
    """Collective, once per process: decide this rank's threads (:func:`plan_threads`) and apply them."""
    if threads.applied() is None:
        threads.apply(plan_threads(comm))
    return threads.applied()
