"""CPU threads of a rank: its share of the node's cores, the user's thread variables honoured, the BLAS
limit applied under mpiexec and recorded in the results' provenance and in ``info``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

from hilbert_hpc.errors import ConfigError
from hilbert_hpc.core.threads import (LOCAL_SIZE_VARIABLES, THREAD_VARIABLES, ThreadPlan, apply, core_share,
                                 cpu_threads, decide, user_setting)

from jobtext import QUICK, job_text

ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = shutil.which("mpiexec")
needs_mpiexec = pytest.mark.skipif(MPIEXEC is None, reason="needs mpiexec on PATH")
CORES = len(os.sched_getaffinity(0))

JOB = job_text(name="threads", **QUICK, defaults={"heads": 2, "head_dim": 8, "dtype": "float32"},
               cases=[{"name": "grid", "grid": [16, 16], "patterns": [[64, 1], [256, 4]]}])


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any thread variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    env.update(PYTHONPATH=str(ROOT), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **extra)
    return env


def mpiexec(ranks: int, args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    cmd = [MPIEXEC, "-n", str(ranks), "--oversubscribe", sys.executable, *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


def test_core_share_counts_the_ranks_that_may_run_on_each_core():
    node = frozenset(range(8))
    assert core_share(node, [node, node]) == 4, "two unbound ranks split the node"
    assert core_share(frozenset({0, 1}), [frozenset({0, 1}), frozenset({2, 3})]) == 2, "bound ranks keep theirs"
    package = frozenset(range(4))
    assert core_share(package, [package] * 4 + [frozenset(range(4, 8))] * 4) == 1, "ranks bound to a package"
    assert core_share(frozenset({0}), [frozenset({0})] * 3) == 1, "never fewer than one thread"


def test_unset_variables_give_the_share_and_limit_the_libraries():
    node = frozenset(range(2))
    plan = decide(node, [node, node], user_setting({}))
    assert (plan.threads, plan.limits_libraries) == (1, True)
    assert "2 core(s)" in plan.source and "1 other rank(s) of the 2 on this node" in plan.source


@pytest.mark.parametrize("name", ["OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"])
def test_a_library_variable_the_user_set_is_left_to_the_libraries(name):
    node = frozenset(range(2))
    plan = decide(node, [node, node], user_setting({name: "3"}))
    assert plan == ThreadPlan(3, f"{name}=3 (set by the user, left to the libraries)", False)


def test_hilbert_hpc_threads_wins_and_limits_the_libraries():
    node = frozenset(range(2))
    plan = decide(node, [node] * 2, user_setting({"OMP_NUM_THREADS": "1", "HILBERT_HPC_THREADS": "4"}))
    assert (plan.threads, plan.limits_libraries) == (4, True)


@pytest.mark.parametrize("value", ["x", "0", "-2", "1.5"])
def test_a_bad_hilbert_hpc_threads_is_refused_naming_it(value):
    with pytest.raises(ConfigError, match="^HILBERT_HPC_THREADS: must be a positive whole number"):
        user_setting({"HILBERT_HPC_THREADS": value})


def test_apply_sets_the_variables_for_libraries_loaded_later_only_when_it_limits(monkeypatch, no_plan):
    import hilbert_hpc.core.threads as threads

    monkeypatch.setattr(threads, "threadpool_limits", lambda limits: None)
    environ: dict[str, str] = {}
    apply(ThreadPlan(2, "test", True), environ)
    assert environ == {"OMP_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    assert cpu_threads() == 2
    environ = {}
    apply(ThreadPlan(3, "test", False), environ)
    assert environ == {} and cpu_threads() == 3


@pytest.fixture
def no_plan(monkeypatch):
    """No plan applied yet in this process (a test before may have started MPI through world())."""
    import hilbert_hpc.core.threads as threads

    monkeypatch.setattr(threads, "_applied", None)


def test_explicit_thread_count(monkeypatch, no_plan):
    monkeypatch.setenv("HILBERT_HPC_THREADS", "3")
    assert cpu_threads() == 3


def test_unbound_ranks_share_the_cores(monkeypatch, no_plan):
    for var in THREAD_VARIABLES + LOCAL_SIZE_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    alone = cpu_threads()
    assert alone == CORES
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", str(2 * CORES))
    expected = 1 if CORES == os.cpu_count() else CORES
    assert cpu_threads() == expected


PROBE = ("from threadpoolctl import threadpool_info; from hilbert_hpc.distributed.mpi import world; world(); "
         "print(max(p['num_threads'] for p in threadpool_info() if p['user_api'] == 'blas'))")


@needs_mpiexec
def test_each_rank_limits_blas_to_its_share_under_mpiexec(tmp_path):
    """Two unbound ranks (--oversubscribe) on this machine: BLAS runs on half the cores each (1 on 2 cores)."""
    res = mpiexec(2, ["-c", PROBE], clean_env(), tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [str(max(1, CORES // 2))] * 2


@needs_mpiexec
def test_an_explicit_openblas_setting_is_honoured_under_mpiexec(tmp_path):
    res = mpiexec(2, ["-c", PROBE], clean_env(OPENBLAS_NUM_THREADS="1"), tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["1", "1"]


@needs_mpiexec
def test_results_provenance_records_threads_per_rank(tmp_path):
    (tmp_path / "job.toml").write_text(JOB)
    res = mpiexec(2, ["-m", "hilbert_hpc", "run", "job.toml", "-o", "r.h5"], clean_env(), tmp_path)
    assert res.returncode == 0, res.stderr
    share = max(1, CORES // 2)
    with h5py.File(tmp_path / "r.h5") as h5:
        assert list(h5.attrs["threads_per_rank"]) == [share, share]
        decided = json.loads(h5.attrs["threads_decided"])
        assert len(decided) == 2 and all("COMM_TYPE_SHARED split" in d for d in decided)
        assert [set(libs.values()) for libs in json.loads(h5.attrs["library_threads"])] == [{share}, {share}]
    res = mpiexec(2, ["-m", "hilbert_hpc", "run", "job.toml", "-o", "o.h5"], clean_env(OMP_NUM_THREADS="1"),
                  tmp_path)
    assert res.returncode == 0, res.stderr
    with h5py.File(tmp_path / "o.h5") as h5:
        assert list(h5.attrs["threads_per_rank"]) == [1, 1]
        assert json.loads(h5.attrs["threads_decided"]) == ["OMP_NUM_THREADS=1 (set by the user, left to the "
                                                           "libraries)"] * 2


def test_info_shows_the_threads(tmp_path):
    res = subprocess.run([sys.executable, "-m", "hilbert_hpc", "info"], cwd=tmp_path, capture_output=True,
                         text=True, env=clean_env(HILBERT_HPC_THREADS="1"), timeout=120)
    assert res.returncode == 0, res.stderr
    assert "threads:  1 per rank (HILBERT_HPC_THREADS=1" in res.stdout
    libraries = next(line for line in res.stdout.splitlines() if line.startswith("blas/omp:"))
    assert libraries.endswith(" 1 thread(s)") and all(part.split()[-1] == "1" for part in
                                                       libraries[len("blas/omp:"):-len(" thread(s)")].split(","))


def test_bad_thread_variable_is_one_line_with_exit_2(tmp_path):
    res = subprocess.run([sys.executable, "-m", "hilbert_hpc", "info"], cwd=tmp_path, capture_output=True,
                         text=True, env=clean_env(HILBERT_HPC_THREADS="many"), timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == ["hilbert-hpc: error: HILBERT_HPC_THREADS: must be a positive "
                                               "whole number of threads per rank, got 'many'"]
