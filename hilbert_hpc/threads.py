"""CPU threading for the NumPy backend: independent tiles over a thread pool, BLAS kept single-threaded.

NumPy's element-wise operations run on one core while BLAS threads only its
own calls; spreading independent tiles over threads (NumPy releases the GIL)
uses every core for both. The thread count is ``HILBERT_HPC_THREADS`` if set,
else the number of cores this process may run on (so an MPI rank bound to one
core uses one thread), shared among the node's ranks when they are not bound.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Callable, Sequence

from threadpoolctl import threadpool_limits


#: launcher variables giving the number of ranks on this node
LOCAL_SIZE_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE")


def cpu_threads() -> int:
    """Worker threads for CPU tiles: ``HILBERT_HPC_THREADS`` or the cores in this process's affinity mask."""
    env = os.environ.get("HILBERT_HPC_THREADS")
    if env:
        return max(1, int(env))
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    if cores == (os.cpu_count() or cores):
        # not bound to a subset: share the node's cores with the other ranks on it
        for var in LOCAL_SIZE_VARIABLES:
            if os.environ.get(var, "").isdigit() and int(os.environ[var]) > 0:
                return max(1, cores // int(os.environ[var]))
    return max(1, cores)


@lru_cache(maxsize=4)
def _pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hilbert-hpc")


def run_parallel(fn: Callable[..., None], items: Sequence[tuple]) -> None:
    """Call ``fn(*item)`` for every item, on :func:`cpu_threads` threads with single-threaded BLAS."""
    workers = min(cpu_threads(), len(items))
    if workers <= 1:
        for item in items:
            fn(*item)
        return
    with threadpool_limits(limits=1, user_api="blas"):
        for future in [_pool(workers).submit(fn, *item) for item in items]:
            future.result()
