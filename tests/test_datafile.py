"""HDF5 inputs: format checks, and the parallel redistribution to serialized shards (pytest-mpi)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hilbert_hpc.distributed.datafile import describe_input, read_rows, read_shard, write_input
from hilbert_hpc.errors import ConfigError, JobFileError
from hilbert_hpc.study.jobfile import load_job
from hilbert_hpc.distributed.mpi import SingleProcessComm
from hilbert_hpc.distributed.sharding import Layout

from clirun import run_in_process
from jobtext import QUICK, job_text

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
    job = load_job(tmp_path / "j.toml", text=job_text(cases=[{"input": str(sample), "patterns": [[1024, 4]]}]))
    case = job.cases[0]
    assert case.grid == (32, 32) and case.heads == 4 and case.head_dim == 16
    with pytest.raises(JobFileError, match="heads = 8 contradicts"):
        load_job(tmp_path / "j.toml", text=job_text(cases=[{"input": str(sample), "heads": 8,
                                                                 "patterns": [[1024, 4]]}]))
    with pytest.raises(JobFileError, match="cannot open"):
        load_job(tmp_path / "j.toml", text=job_text(cases=[{"input": "missing.h5", "patterns": [[1024, 4]]}]))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("grid,ordering", [((24, 16), "hilbert"), ((32, 32), "hilbert"), ((8, 8, 8), "hilbert"),
                                           ((384,), "natural")])
def test_parallel_redistribution_matches_the_permutation(tmp_path_factory, grid, ordering):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    n = int(np.prod(grid))
    q, k, v = _arrays(n, batch=2)
    path = comm.bcast(str(tmp_path_factory.mktemp("redistribution") / "in.h5") if rank == 0 else None)
    if rank == 0:
        write_input(path, q, k, v, grid=grid)
    comm.Barrier()
    layout = Layout(grid, ordering, size)
    for b in range(2):
        got = read_shard(path, "q", b, layout, comm, np.float64)
        assert np.array_equal(got, q[b, layout.shard_natural(rank)])
    comm.Barrier()


# --- files that are refused when the job is loaded -----------------------------------------------------------------

def _write(path: Path, q, k, v, attrs: dict | None = None) -> Path:
    """Q, K, V as given (any dtype, or a callable that makes the object in the file) and root attributes."""
    import h5py

    with h5py.File(path, "w") as f:
        for name, x in zip("qkv", (q, k, v)):
            if callable(x):
                x(f, name)
            else:
                f[name] = x
        for key, value in (attrs or {}).items():
            f.attrs[key] = value
    return path


def _group(f, name):
    f.create_group(name)["data"] = np.zeros((4, 1, 2))


def _empty(f, name):
    import h5py

    f.create_dataset(name, data=h5py.Empty("f4"))


def _vlen_strings(f, name):
    import h5py

    f.create_dataset(name, shape=(4, 1, 2), dtype=h5py.string_dtype())


GOOD_QKV = np.zeros((4, 1, 2), np.float32)
BAD_FILES = [
    ((_group, GOOD_QKV, GOOD_QKV), {}, "q is a group, not a dataset: store q as an array of shape (N, H, D)"),
    ((GOOD_QKV, GOOD_QKV, _empty), {}, "dataset v is empty (no dataspace)"),
    ((GOOD_QKV, GOOD_QKV, np.zeros((4, 1, 2), np.complex64)), {},
     "dataset v has complex dtype complex64, not real numbers: store float or integer values"),
    ((GOOD_QKV, np.zeros((4, 1, 2), bool), GOOD_QKV), {}, "dataset k has boolean dtype bool, not real numbers"),
    ((np.zeros((4, 1, 2), "S3"), GOOD_QKV, GOOD_QKV), {}, "dataset q has string dtype |S3, not real numbers"),
    ((_vlen_strings, GOOD_QKV, GOOD_QKV), {}, "dataset q has object (or variable-length) dtype object"),
    ((np.zeros((4, 1, 2), [("re", "f4"), ("im", "f4")]), GOOD_QKV, GOOD_QKV), {},
     "dataset q has compound (or opaque) dtype"),
    ((np.zeros((0, 1, 2)),) * 3, {}, "dataset q has shape (0, 1, 2), with tokens = 0: every axis needs"),
    ((np.zeros((0, 4, 1, 2)),) * 3, {}, "dataset q has shape (0, 4, 1, 2), with batch = 0"),
    ((np.zeros((4, 0, 2)),) * 3, {}, "dataset q has shape (4, 0, 2), with heads = 0"),
    ((np.zeros((4, 1, 0)),) * 3, {}, "dataset q has shape (4, 1, 0), with head_dim = 0"),
    ((GOOD_QKV, GOOD_QKV, np.zeros((4, 1, 0))), {}, "dataset v has shape (4, 1, 0), with head_dim = 0"),
    ((GOOD_QKV,) * 3, {"grid": np.array([[2, 2]])}, "root attribute grid = array([[2, 2]]) is not a 1-D list of "
     "positive integers: store it as an integer array such as [32, 32], or delete it"),
    ((GOOD_QKV,) * 3, {"grid": np.array([2.0, 2.0])}, "root attribute grid = array([2., 2.]) is not a 1-D list"),
    ((GOOD_QKV,) * 3, {"grid": np.array([-2, -2])}, "root attribute grid = array([-2, -2]) is not a 1-D list"),
    ((GOOD_QKV,) * 3, {"grid": np.array([], np.int64)}, "is not a 1-D list of positive integers"),
    ((GOOD_QKV,) * 3, {"grid": np.int64(4)}, f"root attribute grid = {np.int64(4)!r} is not a 1-D list"),
    ((GOOD_QKV,) * 3, {"grid": "2x2"}, "root attribute grid = '2x2' is not a 1-D list"),
    ((GOOD_QKV,) * 3, {"grid": np.array([True, True])}, "is not a 1-D list of positive integers"),
    ((GOOD_QKV,) * 3, {"grid": np.array([2, 3])}, "root attribute grid = [2, 3] has product 6, but q, k, v hold "
     "N = 4 tokens: fix the attribute"),
]


@pytest.mark.parametrize("qkv, attrs, words", BAD_FILES)
def test_bad_input_contents_are_refused_naming_file_and_dataset(tmp_path, qkv, attrs, words):
    path = _write(tmp_path / "bad.h5", *qkv, attrs=attrs)
    with pytest.raises(ConfigError) as info:
        describe_input(path, "cases[0].input")
    assert info.value.param == "cases[0].input"
    assert info.value.message.startswith(f"input file {str(path)!r}: ")
    assert words in info.value.message, info.value.message


def test_a_bad_input_file_fails_the_job_load(tmp_path):
    path = _write(tmp_path / "c.h5", GOOD_QKV, GOOD_QKV, GOOD_QKV.astype(np.complex64))
    with pytest.raises(JobFileError) as info:
        load_job(tmp_path / "j.toml", text=job_text(cases=[{"input": str(path), "patterns": [[4, 1]]}]))
    assert info.value.param == "cases[0].input" and "dataset v has complex dtype complex64" in info.value.message


def test_integer_inputs_and_a_good_grid_are_accepted(tmp_path):
    path = _write(tmp_path / "i.h5", *(np.arange(8, dtype=dt).reshape(4, 1, 2) for dt in ("i2", "u1", "f2")),
                  attrs={"grid": np.array([2, 2], np.int32)})
    info = describe_input(path)
    assert info["grid"] == (2, 2) and info["tokens"] == 4
    assert read_rows(path, "k", 0, np.array([3, 0]), np.float64).tolist() == [[[6.0, 7.0]], [[0.0, 1.0]]]


# --- NaN / Inf: refused when read ----------------------------------------------------------------------------------

def _message(path, tensor: str, index: tuple[int, ...], what: str) -> str:
    where = ", ".join(map(str, index))
    return (f"input file {str(path)!r}, dataset {tensor}: element [{where}] (batch, token, head, dim), natural order, "
            f"{what}: inputs must be finite numbers; fix the file")


@pytest.mark.parametrize("ordering", ["natural", "hilbert"])
def test_single_process_read_refuses_the_first_non_finite_value(tmp_path, ordering):
    q, k, v = _arrays(256, batch=2)
    k[1, 200, 0, 3] = np.nan                 # natural order: the first bad value of batch element 1 ...
    k[1, 201, 0, 0] = np.inf                 # ... not this one, nor the one of the other batch element
    k[0, 250, 2, 1] = -np.inf
    write_input(tmp_path / "in.h5", q, k, v, grid=(16, 16))
    layout = Layout((16, 16), ordering, 1)
    comm = SingleProcessComm()
    with pytest.raises(ConfigError) as info:
        read_shard(tmp_path / "in.h5", "k", 1, layout, comm, np.float32)
    assert info.value.param == "input"
    assert info.value.message == _message(tmp_path / "in.h5", "k", (1, 200, 0, 3), "is nan")
    with pytest.raises(ConfigError) as info:
        read_shard(tmp_path / "in.h5", "k", 0, layout, comm, np.float64, param="cases[0].input")
    assert info.value.param == "cases[0].input"
    assert info.value.message == _message(tmp_path / "in.h5", "k", (0, 250, 2, 1), "is -inf")
    assert np.array_equal(read_shard(tmp_path / "in.h5", "q", 1, layout, comm, np.float64),
                          q[1, layout.shard_natural(0)])


def test_values_that_overflow_the_compute_dtype_are_refused(tmp_path):
    q, k, v = _arrays(16)
    v[9, 1, 2] = 1e300
    write_input(tmp_path / "in.h5", q, k, v)
    with pytest.raises(ConfigError) as info:
        read_shard(tmp_path / "in.h5", "v", 0, Layout((16,), "natural", 1), SingleProcessComm(), np.float32)
    assert info.value.message == _message(tmp_path / "in.h5", "v", (0, 9, 1, 2), "= 1e+300 overflows float32")
    got = read_shard(tmp_path / "in.h5", "v", 0, Layout((16,), "natural", 1), SingleProcessComm(), np.float64)
    assert got[9, 1, 2] == 1e300


def test_read_rows_refuses_non_finite_values(tmp_path):
    q, k, v = _arrays(50, batch=2)
    v[1, 30, 2, 1] = np.nan
    write_input(tmp_path / "in.h5", q, k, v)
    assert np.array_equal(read_rows(tmp_path / "in.h5", "v", 1, np.array([7, 3]), np.float64), v[1, [7, 3]])
    with pytest.raises(ConfigError) as info:
        read_rows(tmp_path / "in.h5", "v", 1, np.array([40, 30, 7, 30]), np.float64)
    assert info.value.message == _message(tmp_path / "in.h5", "v", (1, 30, 2, 1), "is nan")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("ordering", ["natural", "hilbert"])
def test_every_rank_raises_the_same_error_when_one_rank_reads_a_nan(tmp_path_factory, ordering):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    grid = (16, 16)
    layout = Layout(grid, ordering, size)
    bad = layout.shard + 5                       # a token in the natural block that rank 1 reads
    q, k, v = _arrays(256, batch=2)
    v[1, bad, 2, 3] = np.nan
    v[1, 2 * layout.shard - 1, 0, 0] = np.inf   # later in rank 1's block: not reported
    tmp = Path(comm.bcast(str(tmp_path_factory.mktemp("nan")) if rank == 0 else None))
    if rank == 0:
        write_input(tmp / "in.h5", q, k, v, grid=grid)
    comm.Barrier()
    assert np.array_equal(read_shard(tmp / "in.h5", "v", 0, layout, comm, np.float64),
                          v[0, layout.shard_natural(rank)])
    error = None
    try:
        read_shard(tmp / "in.h5", "v", 1, layout, comm, np.float32)
    except ConfigError as exc:
        error = str(exc)
    everyone = comm.allgather(error)
    assert everyone == [f"input: {_message(tmp / 'in.h5', 'v', (1, bad, 2, 3), 'is nan')}"] * size
    comm.Barrier()


@pytest.mark.mpi(min_size=2)
def test_when_several_ranks_read_a_nan_all_report_the_first(tmp_path_factory):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    layout = Layout((256,), "natural", size)
    q, k, v = _arrays(256)
    for p in range(size):
        q[p * layout.shard + 3, 1, p % 4] = np.inf if p % 2 else np.nan
    tmp = Path(comm.bcast(str(tmp_path_factory.mktemp("nan2")) if rank == 0 else None))
    if rank == 0:
        write_input(tmp / "in.h5", q, k, v)
    comm.Barrier()
    with pytest.raises(ConfigError) as info:
        read_shard(tmp / "in.h5", "q", 0, layout, comm, np.float64, param="cases[1].input")
    assert comm.allgather((info.value.param, info.value.message)) == [
        ("cases[1].input", _message(tmp / "in.h5", "q", (0, 3, 1, 0), "is nan"))] * size
    comm.Barrier()


# --- the command line: one line, exit code 2 -----------------------------------------------------------------------

BAD_INPUT_JOB = job_text(name="bad-input", **QUICK,
                         cases=[{"name": "inf", "input": "in.h5", "patterns": [[64, 1]], "ordering": "hilbert"}])


def _run_bad_input_job(folder: Path):
    """``hilbert-hpc run`` of BAD_INPUT_JOB in ``folder`` (its in.h5 made by the caller): exit 2, no traceback."""
    (folder / "job.toml").write_text(BAD_INPUT_JOB)
    res = run_in_process(["run", "job.toml", "-o", "out.h5"], folder)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    return res


def test_cli_refuses_an_input_with_an_inf_in_one_line(tmp_path):
    q, k, v = _arrays(128, heads=2)
    v[77, 1, 0] = np.inf
    write_input(tmp_path / "in.h5", q, k, v, grid=(8, 16))
    res = _run_bad_input_job(tmp_path)
    assert res.stderr.splitlines() == [f"hilbert-hpc: error: input: {_message('in.h5', 'v', (0, 77, 1, 0), 'is inf')}"]


# --- inputs that pass the load-time checks but cannot be read --------------------------------------------------------

def _checksummed_with_a_damaged_chunk(path: Path) -> Path:
    """q, k, v with fletcher32 checksums; one byte of a chunk of ``v`` flipped (the file still opens)."""
    import h5py

    q, k, v = _arrays(128, heads=2)
    with h5py.File(path, "w") as f:
        for name, x in zip("qkv", (q, k, v)):
            f.create_dataset(name, data=x, chunks=(16, 2, 4), fletcher32=True)
        offset = f["v"].id.get_chunk_info(3).byte_offset
    data = bytearray(path.read_bytes())
    data[offset + 10] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def test_data_failing_its_checksum_is_one_configerror_naming_file_and_dataset(tmp_path):
    path = _checksummed_with_a_damaged_chunk(tmp_path / "in.h5")
    assert describe_input(path)["tokens"] == 128          # the load-time check cannot see it
    with pytest.raises(ConfigError) as info:
        read_shard(path, "v", 0, Layout((128,), "natural", 1), SingleProcessComm(), np.float64)
    assert "'" + str(path) + "'" in info.value.message and "dataset v" in info.value.message
    assert "checksum" in info.value.message
    with pytest.raises(ConfigError, match="dataset v"):
        read_rows(path, "v", 0, np.arange(128), np.float64)


def test_a_dangling_external_link_is_refused_at_load(tmp_path):
    import h5py

    q, k, _ = _arrays(128, heads=2)
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f["q"], f["k"] = q, k
        f["v"] = h5py.ExternalLink("missing.h5", "/v")
    with pytest.raises(ConfigError) as info:
        describe_input(tmp_path / "in.h5", "cases[0].input")
    assert info.value.param == "cases[0].input"
    assert "v is an external link to '/v' in 'missing.h5', which cannot be opened" in info.value.message


def test_cli_refuses_an_input_failing_its_checksum_in_one_line(tmp_path):
    _checksummed_with_a_damaged_chunk(tmp_path / "in.h5")
    res = _run_bad_input_job(tmp_path)
    errors = [line for line in res.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "in.h5" in errors[0] and "checksum" in errors[0], res.stderr
