"""CPU thread count of the NumPy backend: explicit setting, sharing the node among unbound ranks."""

from __future__ import annotations

import os

from hilbert_hpc.threads import LOCAL_SIZE_VARIABLES, cpu_threads


def test_explicit_thread_count(monkeypatch):
    monkeypatch.setenv("HILBERT_HPC_THREADS", "3")
    assert cpu_threads() == 3


def test_unbound_ranks_share_the_cores(monkeypatch):
    monkeypatch.delenv("HILBERT_HPC_THREADS", raising=False)
    for var in LOCAL_SIZE_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    cores = len(os.sched_getaffinity(0))
    alone = cpu_threads()
    assert alone == cores
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", str(2 * cores))
    expected = 1 if cores == os.cpu_count() else cores
    assert cpu_threads() == expected
