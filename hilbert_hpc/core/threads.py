"""CPU threads of a rank: its share of the node's cores, BLAS/OpenMP limited to it, tiles over a thread pool.

Every MPI rank on a node would otherwise start one BLAS (and OpenMP) thread per
core of the node, so ``mpiexec -n 2`` on two cores ran four busy threads that
spun against each other. :func:`hilbert_hpc.distributed.mpi.limit_rank_threads` (called once when MPI
starts, see :func:`hilbert_hpc.distributed.mpi.world`) gives each rank its share of the cores in its
affinity mask, counting the ranks of its node (a shared-memory split) that may
run on the same cores, and limits BLAS and OpenMP to that share through
threadpoolctl. A thread count the user set is honoured instead:
``HILBERT_HPC_THREADS`` (this program's threads per rank: tiles and BLAS), or
``OMP_NUM_THREADS``/``OPENBLAS_NUM_THREADS``/``MKL_NUM_THREADS`` (then the
libraries keep what they read from those).

NumPy's element-wise operations run on one core while BLAS threads only its
own calls; :func:`run_parallel` spreads independent tiles over the rank's
threads (NumPy releases the GIL), with single-threaded BLAS inside each tile.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any, Callable, Mapping, MutableMapping, Sequence

from threadpoolctl import threadpool_info, threadpool_limits

from hilbert_hpc.errors import ConfigError

#: variables by which the user sets thread counts, in the order they are honoured
THREAD_VARIABLES = ("HILBERT_HPC_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

#: variables set for libraries loaded after the limit (e.g. torch's OpenMP), when the user set none
LATE_LIBRARY_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

#: launcher variables giving the number of ranks on this node (used before MPI has started)
LOCAL_SIZE_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE")


@dataclass(frozen=True)
class ThreadPlan:
    """Threads of this rank and how they were decided.

    ``threads``: worker threads for CPU tiles and the BLAS/OpenMP limit;
    ``source``: one line saying where the number came from;
    ``limits_libraries``: True when this program limits BLAS/OpenMP to ``threads``
    (False when the user's OMP/OPENBLAS/MKL variable is left to the libraries).
    """

    threads: int
    source: str
    limits_libraries: bool


#: a thread variable the user set: (name, value, its leading count or None)
Setting = tuple[str, str, int | None]

_applied: ThreadPlan | None = None


def affinity() -> frozenset[int]:
    """The cores this process may run on (its affinity mask; all cores where there is none)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return frozenset(range(os.cpu_count() or 1))


def core_share(mine: frozenset[int], masks: Sequence[frozenset[int]]) -> int:
    """This rank's whole cores: each core of ``mine`` counts 1/k when k ranks of the node (``masks``,
    this rank's included) may run on it. Unbound ranks split the node; ranks bound to their own cores
    keep them. At least 1."""
    share = sum((Fraction(1, max(1, sum(core in m for m in masks))) for core in mine), Fraction(0))
    return max(1, int(share))


def _count(name: str, value: str) -> int | None:
    """The leading count of a thread variable ('4', or OpenMP's nested '4,2'); None when it has none."""
    head = value.split(",", 1)[0].strip()
    if head.isdigit() and int(head) > 0:
        return int(head)
    if name == "HILBERT_HPC_THREADS":
        raise ConfigError(f"must be a positive whole number of threads per rank, got {value!r}", name)
    return None


def user_setting(environ: Mapping[str, str]) -> Setting | None:
    """The first thread variable (THREAD_VARIABLES order) set to a non-empty value: (name, value, count).
    Raises ConfigError (a ValueError) for a ``HILBERT_HPC_THREADS`` that is not a positive whole number."""
    for name in THREAD_VARIABLES:
        value = environ.get(name, "").strip()
        if value:
            return name, value, _count(name, value)
    return None


def decide(mine: frozenset[int], masks: Sequence[frozenset[int]], setting: Setting | None,
           how_counted: str = "COMM_TYPE_SHARED split") -> ThreadPlan:
    """The thread plan of a rank with affinity ``mine`` among the node's ranks with affinities ``masks``
    (this rank's included), given the user's thread variable ``setting`` (:func:`user_setting`)."""
    share = core_share(mine, masks)
    if setting is None:
        others = sum(1 for m in masks if m & mine) - 1
        return ThreadPlan(share, f"{len(mine)} core(s) in its affinity mask, shared with {others} other rank(s) "
                                 f"of the {len(masks)} on this node ({how_counted})", True)
    name, value, count = setting
    if name == "HILBERT_HPC_THREADS":
        return ThreadPlan(count, f"{name}={value}", True)
    if count is None:
        return ThreadPlan(share, f"{name}={value} left to the libraries; tiles on this rank's share of the "
                                 f"node's cores", False)
    return ThreadPlan(count, f"{name}={value} (set by the user, left to the libraries)", False)


def apply(plan: ThreadPlan, environ: MutableMapping[str, str] | None = None) -> None:
    """Limit the loaded BLAS/OpenMP libraries to ``plan.threads`` (when the plan says so), and set the
    library variables for those loaded later; remember the plan for :func:`cpu_threads`."""
    global _applied
    environ = os.environ if environ is None else environ
    if plan.limits_libraries:
        threadpool_limits(limits=plan.threads)
        for name in LATE_LIBRARY_VARIABLES:
            environ[name] = str(plan.threads)
    _applied = plan


def applied() -> ThreadPlan | None:
    """The plan applied in this process (:func:`apply`), or None before."""
    return _applied


def current_plan() -> ThreadPlan:
    """The plan applied by :func:`hilbert_hpc.distributed.mpi.limit_rank_threads`; without one (the Python API, MPI not started), one
    from this process's affinity, shared by the node's ranks that the launcher's variables count when the
    process is not bound to a subset of the cores, applying nothing."""
    if _applied is not None:
        return _applied
    mine = affinity()
    ranks = 1
    if len(mine) >= (os.cpu_count() or len(mine)):   # not bound to a subset: the node's ranks share its cores
        for var in LOCAL_SIZE_VARIABLES:
            if os.environ.get(var, "").isdigit() and int(os.environ[var]) > 0:
                ranks = int(os.environ[var])
                break
    return decide(mine, [mine] * ranks, user_setting(os.environ), how_counted="launcher variables")


def cpu_threads() -> int:
    """Worker threads for CPU tiles on this rank (:func:`current_plan`)."""
    return current_plan().threads


def library_threads() -> dict[str, int]:
    """Threads each loaded BLAS/OpenMP library would use now, as threadpoolctl reports them."""
    found: dict[str, int] = {}
    for pool in threadpool_info():
        name = pool.get("internal_api", pool.get("user_api", "?"))
        found[name] = max(found.get(name, 0), int(pool.get("num_threads", 0)))
    return found


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
