"""Shared test helpers: random problem configurations; the environment every test process and its children get."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

# Open MPI's libfabric (OFI) transport sleeps a second in every MPI_Init of a machine without a fabric; the tests
# run their ranks on one node, where the shared-memory transport carries the messages. Set before any test
# initializes MPI (pytest-mpi does so lazily), it reaches the commands and mpiexec runs the tests start.
os.environ.setdefault("OMPI_MCA_btl", "^ofi")

GRIDS = [(384,), (512,), (16, 24), (32, 16), (8, 6, 8), (4, 8, 16), (10, 12)]


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def random_config(seed: int, max_heads: int = 12, dims=(8, 16, 32, 64, 128)) -> dict:
    """A random valid problem: grid (1-D/2-D/3-D), 1-3 patterns, dilation 1-8, causal, H, D, ordering."""
    rng = np.random.default_rng(seed)
    grid = GRIDS[rng.integers(len(GRIDS))]
    n = math.prod(grid)
    patterns = []
    for _ in range(rng.integers(1, 4)):
        r = int(rng.choice([x for x in range(1, 9) if n % x == 0]))
        ws = [w for w in divisors(n) if w % r == 0 and w >= 2 * r] or [n]
        patterns.append((int(rng.choice(ws)), r))
    return dict(
        grid=grid,
        patterns=patterns,
        causal=bool(rng.integers(2)),
        heads=int(rng.integers(1, max_heads + 1)),
        head_dim=int(rng.choice(dims)),
        ordering=str(rng.choice(["natural", "hilbert"])),
    )


def random_qkv(cfg: dict, seed: int, dtype=np.float64, magnitude: float = 1.0):
    rng = np.random.default_rng(seed + 1000)
    n = math.prod(cfg["grid"])
    shape = (n, cfg["heads"], cfg["head_dim"])
    return tuple((magnitude * rng.standard_normal(shape)).astype(dtype) for _ in range(3))


def rel_err(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture
def config_factory():
    return random_config


def _a_later_rank(config: pytest.Config) -> bool:
    """True on ranks 1, 2, ... of an MPI run of the tests (``--with-mpi`` under mpiexec)."""
    from hilbert_hpc.distributed.mpi import env_rank

    return bool(config.getoption("--with-mpi", default=False)) and bool(env_rank())


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Under mpiexec rank 0 reports as usual; the other ranks say only what failed on them (their tracebacks), no
    header, progress or summary of their own."""
    if _a_later_rank(config):
        config.option.verbose = -2
        config.option.no_header = True
        config.option.console_output_style = "classic"


def pytest_sessionstart(session: pytest.Session) -> None:
    """pytest-mpi prints an "MPI Information" section at the end of every rank's run: rank 0's is enough."""
    if _a_later_rank(session.config):
        for plugin in session.config.pluginmanager.get_plugins():
            if type(plugin).__name__ == "MPIPlugin":
                plugin._is_testing_mpi = False


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config):
    """No progress letter on ranks 1, 2, ... but for a failure."""
    if _a_later_rank(config) and not report.failed:
        return report.outcome, "", ""
    return None


def pytest_terminal_summary(terminalreporter, exitstatus: int) -> None:
    """Name the rank whose failures were just printed (ranks 1, 2, ... of an MPI run)."""
    if exitstatus != 0 and _a_later_rank(terminalreporter.config):
        from hilbert_hpc.distributed.mpi import env_rank

        terminalreporter.write_sep("=", f"the failures above are rank {env_rank()}'s")


def gpu_available() -> bool:
    """True when CuPy is installed and sees at least one NVIDIA GPU."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - ImportError, or CuPy without a driver (CUDARuntimeError)
        return False
