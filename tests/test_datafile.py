"""HDF5 inputs: format checks, and the parallel redistribution to serialized shards (pytest-mpi)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hilbert_hpc.datafile import describe_input, read_rows, read_shard, write_input
from hilbert_hpc.errors import ConfigError, JobFileError
from hilbert_hpc.jobfile import load_job
from hilbert_hpc.mpi import SingleProcessComm
from hilbert_hpc.sharding import Layout

ROOT = Path(__file__).resolve().parents[1]


def _arrays(n: int, heads: int = 3, d: int = 4, batch: int | None = None):
    rng = np.random.default_rng(n)
    shape = (n, heads, d) if batch is None else (batch, n, heads, d)
    return [rng.standard_normal(shape) for _ in range(3)]


@pytest.mark.parametrize("grid,ordering", [((12, 10), "hilbert"), ((16, 16), "hilbert"), ((120,), "natural")])
def test_single_process_shard_is_the_serialized_sequence(tmp_path, grid, ordering):
    n = int(np.prod(grid))
    q, k, v = _arrays(n)
    write_input(tmp_path / "in.h5", q, k, v, grid=grid)
    layout = Layout(grid, ordering, 1)
    got = read_shard(tmp_path / "in.h5", "k", 0, layout, SingleProcessComm(), np.float64)
    assert np.array_equal(got, k[layout.shard_natural(0)])


def test_read_rows_with_repeats_and_batches(tmp_path):
    q, k, v = _arrays(50, batch=2)
    write_input(tmp_path / "in.h5", q, k, v)
    idx = np.array([7, 3, 7, 49, 0])
    assert np.array_equal(read_rows(tmp_path / "in.h5", "v", 1, idx, np.float64), v[1, idx])
    assert describe_input(tmp_path / "in.h5")["batch"] == 2


def test_bad_input_files_are_named(tmp_path):
    (tmp_path / "junk.h5").write_text("not hdf5")
    with pytest.raises(ConfigError, match="cannot open"):
        describe_input(tmp_path / "junk.h5")
    import h5py

    with h5py.File(tmp_path / "partial.h5", "w") as f:
        f["q"] = np.zeros((4, 1, 2))
    with pytest.raises(ConfigError, match="lacks dataset"):
        describe_input(tmp_path / "partial.h5")


def test_job_takes_shape_from_the_file_and_refuses_contradictions(tmp_path):
    sample = ROOT / "data" / "grid32x32.h5"
    job = load_job(tmp_path / "j.toml", text=f'[[cases]]\ninput = "{sample}"\npatterns = [[1024, 4]]\n')
    case = job.cases[0]
    assert case.grid == (32, 32) and case.heads == 4 and case.head_dim == 16
    with pytest.raises(JobFileError, match="heads = 8 contradicts"):
        load_job(tmp_path / "j.toml", text=f'[[cases]]\ninput = "{sample}"\nheads = 8\npatterns = [[1024, 4]]\n')
    with pytest.raises(JobFileError, match="cannot open"):
        load_job(tmp_path / "j.toml", text='[[cases]]\ninput = "missing.h5"\npatterns = [[1024, 4]]\n')


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("grid,ordering", [((24, 16), "hilbert"), ((32, 32), "hilbert"), ((8, 8, 8), "hilbert"),
                                           ((384,), "natural")])
def test_parallel_redistribution_matches_the_permutation(grid, ordering):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    n = int(np.prod(grid))
    q, k, v = _arrays(n, batch=2)
    path = None
    if rank == 0:
        import tempfile

        path = str(Path(tempfile.mkdtemp()) / "in.h5")
        write_input(path, q, k, v, grid=grid)
    path = comm.bcast(path)
    layout = Layout(grid, ordering, size)
    for b in range(2):
        got = read_shard(path, "q", b, layout, comm, np.float64)
        assert np.array_equal(got, q[b, layout.shard_natural(rank)])
    comm.Barrier()
