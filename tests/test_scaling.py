"""Scaling studies: rank-count sweeps and weak scaling in job files, sub-communicator runs, plan, progress."""

from __future__ import annotations

import io
import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from hilbert_hpc.cli import main
from hilbert_hpc.errors import ConfigError, JobFileError
from hilbert_hpc.study.jobfile import load_job
from hilbert_hpc.core.patterns import Pattern

from jobtext import DROP, QUICK, JobSpec

SCALING = JobSpec({"name": "scaling", **QUICK, "save_output": True},
                  defaults={"heads": 3, "head_dim": 16, "dtype": "float64"},
                  cases=[{"name": "strong", "grid": [32, 32], "ranks": "pow2",
                          "patterns": [[64, 1], [256, 4], ["N", "N/64"]]},
                         {"name": "weak", "grid": [16, 32], "scaling": "weak", "ranks": "pow2",
                          "patterns": [[64, 2], ["N", "N/32"]]}])
STUDY = SCALING.text()


def _job(tmp_path: Path, text: str, world_size: int | None):
    path = tmp_path / "study.toml"
    path.write_text(text)
    return load_job(path, world_size=world_size)


def test_pow2_ranks_and_weak_scaling_expand_per_rank_count(tmp_path):
    job = _job(tmp_path, STUDY, 4)
    strong = [c for c in job.cases if c.name == "strong"]
    weak = [c for c in job.cases if c.name == "weak"]
    assert [c.ranks for c in strong] == [1, 2, 4] and {c.tokens for c in strong} == {1024}
    assert strong[0].patterns[-1] == Pattern(1024, 16)            # ["N", "N/64"] at N = 1024
    assert [(c.ranks, c.grid, c.tokens) for c in weak] == [(1, (16, 32), 512), (2, (32, 32), 1024),
                                                           (4, (64, 32), 2048)]
    assert [c.patterns[-1] for c in weak] == [Pattern(512, 16), Pattern(1024, 32), Pattern(2048, 64)]
    assert len({c.case_id for c in job.cases}) == 6
    assert all(c.params()["ranks"] == c.ranks for c in job.cases)


def test_ranks_default_to_the_whole_run(tmp_path):
    text = SCALING.but(case={"ranks": DROP}).text()
    assert {c.ranks for c in _job(tmp_path, text, 2).cases} == {2}
    assert {c.ranks for c in _job(tmp_path, text, None).cases} == {1}


@pytest.mark.parametrize("edit, where, words", [
    ((0, {"ranks": 8}), "cases[0].ranks", "needs 8 ranks, this run has 4"),
    ((0, {"ranks": "some"}), "cases[0].ranks", "expected an integer"),
    ((0, {"patterns": [[64, 1], [256, 4], ["N", "N/0"]]}), "cases[0].patterns[2]", "\"N/k\""),
    ((0, {"patterns": [[64, 1], [256, 4], ["N", "N/3"]]}), "cases[0].patterns[2]", "divisible by 3"),
    ((1, {"scaling": "sideways"}), "cases[1].scaling", "strong, weak"),
])
def test_bad_scaling_keys_name_the_problem(tmp_path, edit, where, words):
    with pytest.raises(JobFileError) as info:
        _job(tmp_path, SCALING.but_case(*edit).text(), 4)
    assert where in str(info.value) and words in str(info.value)


def test_plan_counts_memory_traffic_and_flops(tmp_path):
    from hilbert_hpc.core.patterns import useful_flops
    from hilbert_hpc.study.plan import estimate

    job = _job(tmp_path, STUDY, 4)
    est = {(c.name, c.ranks): (c, estimate(c)) for c in job.cases}
    case, e = est[("strong", 4)]
    shard = 1024 // 4
    assert e.tokens_per_rank == shard
    assert e.floor_bytes == 4 * shard * 3 * 16 * 8                      # Q, K, V, O in float64
    assert e.flops == useful_flops(1024, 3, 16, case.patterns, False)
    # the global pattern (1024 tokens, dilation 16): 64 rows per rank, heads 0..2 each one offset
    assert e.sent_bytes == 3 * (shard // 16) * 3 * (16 + 16) * 8      # 3 sends of the packed K/V block
    assert est[("strong", 1)][1].sent_bytes == 0


def test_plan_command_flags_cases_that_do_not_fit(tmp_path, capsys):
    (tmp_path / "study.toml").write_text(STUDY)
    assert main(["plan", str(tmp_path / "study.toml"), "-n", "4", "--host-memory", "1GiB"]) == 0
    assert main(["plan", str(tmp_path / "study.toml"), "-n", "4", "--host-memory", "10kB"]) == 3
    out = capsys.readouterr().out
    assert "NO" in out and "do not fit" in out
    assert main(["plan", str(tmp_path / "study.toml"), "-n", "4", "--host-memory", "lots"]) == 2


def test_run_refuses_a_case_that_cannot_fit_before_any_work(tmp_path, monkeypatch):
    from hilbert_hpc.study import plan
    from hilbert_hpc.study.runner import run_job

    job = _job(tmp_path, STUDY, 1)
    monkeypatch.setattr(plan, "available_bytes", lambda on_gpu, per_node=1: 1000)
    with pytest.raises(ConfigError, match="GiB of host memory per rank"):
        run_job(job, output=str(tmp_path / "r.h5"), stream=io.StringIO())
    assert not (tmp_path / "r.h5").exists()


def test_run_leaves_out_the_optional_peers_cases_that_cannot_fit(tmp_path, monkeypatch, capsys):
    """A peer listed in job.optional_backends whose case needs more memory than a rank has is left out with a
    note (the other cases run); a case of any other backend that cannot fit is still refused."""
    from hilbert_hpc.study import plan
    from hilbert_hpc.study.runner import check_case, run_job

    peer = {"name": "peer", "grid": [64, 64], "ranks": 1, "backend": "torch", "patterns": [[64, 1], [1024, 4]]}
    text = SCALING.but(optional_backends=["torch"], cases=[
        {"name": "ours", "grid": [16, 16], "ranks": 1, "patterns": [[64, 1], [256, 4]]}, peer]).text()
    job = _job(tmp_path, text, 1)
    need = {c.backend: plan.estimate(c, setup=check_case(c), accuracy_rows=job.accuracy_rows).memory_bytes
            for c in job.cases}
    assert need["torch"] > need["numpy"]               # the peer's case is the larger one
    monkeypatch.setattr(plan, "available_bytes", lambda on_gpu, per_node=1: need["numpy"])
    path = run_job(job, output=str(tmp_path / "r.h5"), stream=io.StringIO())
    with h5py.File(path) as f:
        assert [g.attrs["backend"] for g in f["cases"].values()] == ["numpy"]
        left = json.loads(f.attrs["left_out"])
    err = capsys.readouterr().err
    assert "note: case 0001-peer of optional backend 'torch' is left out: it needs about" in err
    assert len(left) == 1 and left[0].startswith("case 0001-peer of optional backend 'torch' is left out")
    assert main(["plan", str(tmp_path / "study.toml"), "-n", "1", "--host-memory", f"{need['numpy']}B"]) == 0
    assert "NO, left out" in capsys.readouterr().out              # plan says so, and does not fail for it

    # a file that holds the peer's result (written where it fitted) resumes where it does not fit: kept
    monkeypatch.setattr(plan, "available_bytes", lambda on_gpu, per_node=1: None)
    both = run_job(job, output=str(tmp_path / "both.h5"), stream=io.StringIO())
    monkeypatch.setattr(plan, "available_bytes", lambda on_gpu, per_node=1: need["numpy"])
    run_job(job, output=str(both), stream=io.StringIO(), resume=True)
    with h5py.File(both) as f:
        assert sorted(g.attrs["backend"] for g in f["cases"].values()) == ["numpy", "torch"]
        assert len(json.loads(f.attrs["resumes"])[-1]["left_out"]) == 1
    assert "the file's result is kept" in capsys.readouterr().err
    only = SCALING.but(optional_backends=["torch"], cases=[peer]).text()
    with pytest.raises(ConfigError, match="no case of the job fits the memory here"):
        run_job(_job(tmp_path, only, 1), output=str(tmp_path / "o.h5"), stream=io.StringIO())
    assert main(["plan", str(tmp_path / "study.toml"), "-n", "1", "--host-memory", f"{need['numpy']}B"]) == 3
    strict = _job(tmp_path, SCALING.but(cases=[peer]).text(), 1)
    with pytest.raises(ConfigError, match="GiB of host memory per rank"):
        run_job(strict, output=str(tmp_path / "s.h5"), stream=io.StringIO())
    assert not (tmp_path / "s.h5").exists()


def test_progress_lines_weigh_cases_by_work():
    from hilbert_hpc.study.progress import Progress

    stream = io.StringIO()
    p = Progress([1e9, 3e9], stream)
    first = p.advance(0, "a")
    assert "1/2 cases, 25% of the work" in first and "left" in first
    assert "2/2 cases, 100% of the work" in p.advance(1, "b") and "left" not in stream.getvalue().splitlines()[1]


@pytest.mark.mpi(min_size=2)
def test_one_run_covers_every_rank_count_with_identical_results(tmp_path_factory):
    """Cases on 1, 2, 4 ... ranks in one run (sub-communicators) agree with each other and with float64 truth."""
    from mpi4py import MPI

    from hilbert_hpc.study.runner import run_job

    comm = MPI.COMM_WORLD
    tmp = Path(comm.bcast(str(tmp_path_factory.mktemp("scaling")) if comm.Get_rank() == 0 else None))
    job = load_job(tmp / "study.toml", text=STUDY, world_size=comm.Get_size())
    out = run_job(job, output=str(tmp / "r.h5"), stream=io.StringIO(), comm=comm, progress=io.StringIO())
    comm.Barrier()
    if comm.Get_rank() != 0:
        return
    with h5py.File(out) as f:
        cases = {cid: g for cid, g in f["cases"].items()}
        strong = [g for g in cases.values() if g.attrs["name"] == "strong"]
        assert sorted(int(g.attrs["ranks"]) for g in strong) == [p for p in (1, 2, 4, 8) if p <= comm.Get_size()]
        ref = strong[0]["output"][...]
        assert np.isfinite(ref).all()
        for g in strong[1:]:
            assert np.allclose(g["output"][...], ref, rtol=0, atol=1e-12)
            assert g["timings"]["attention"].shape[0] == g.attrs["ranks"]
        for g in cases.values():
            assert g.attrs["complete"] and g["accuracy"].attrs["max_rel_err"] < 1e-12
            assert g["output"].is_virtual
        weak = sorted((int(g.attrs["ranks"]), int(g.attrs["tokens"])) for g in cases.values()
                      if g.attrs["name"] == "weak")
        assert all(tokens == 512 * p for p, tokens in weak)


def test_a_wrong_result_is_flagged_before_timing(tmp_path, monkeypatch, capsys):
    from hilbert_hpc.backends.numpy_backend import NumpyBackend
    from hilbert_hpc.study.runner import run_job

    right = NumpyBackend.serialized_attention
    monkeypatch.setattr(NumpyBackend, "serialized_attention", lambda *a, **k: right(*a, **k) * 1.01)
    job = _job(tmp_path, SCALING.but(save_output=False).text(), 1)
    out = run_job(job, output=str(tmp_path / "bad.h5"), stream=io.StringIO(), progress=io.StringIO())
    assert "exceeds the float64 tolerance" in capsys.readouterr().err
    with h5py.File(out) as f:
        acc = [g["accuracy"].attrs for g in f["cases"].values()]
        assert all(not a["within_tolerance"] and a["max_rel_err"] > 1e-3 for a in acc)


@pytest.mark.mpi(min_size=2)
def test_output_layouts_agree_parallel_hdf5_when_h5py_has_mpi(tmp_path_factory, monkeypatch):
    """Outputs at scale: one shared file through parallel HDF5 when h5py has MPI, else per-rank files;
    either way the natural-order output equals the per-rank layout's bit for bit."""
    from mpi4py import MPI

    from hilbert_hpc.study.runner import run_job

    comm = MPI.COMM_WORLD
    tmp = Path(comm.bcast(str(tmp_path_factory.mktemp("layouts")) if comm.Get_rank() == 0 else None))
    job = load_job(tmp / "study.toml", text=STUDY, world_size=comm.Get_size())
    monkeypatch.setenv("HILBERT_HPC_PARALLEL_HDF5", "0")
    per_rank = run_job(job, output=str(tmp / "per_rank.h5"), stream=io.StringIO(), comm=comm, progress=io.StringIO())
    monkeypatch.delenv("HILBERT_HPC_PARALLEL_HDF5")
    default = run_job(job, output=str(tmp / "default.h5"), stream=io.StringIO(), comm=comm, progress=io.StringIO())
    comm.Barrier()
    if comm.Get_rank() != 0:
        return
    with h5py.File(per_rank) as a, h5py.File(default) as b:
        assert sorted(a["cases"]) == sorted(b["cases"])
        for cid, ga in a["cases"].items():
            gb, ranks = b["cases"][cid], int(ga.attrs["ranks"])
            parts_a, parts_b = (json.loads(g["output"].attrs["parts"]) for g in (ga, gb))
            assert [Path(p).name for p in parts_a] == [f"rank{r:05d}.h5" for r in range(ranks)]
            shared = ranks > 1 and h5py.get_config().mpi
            assert [Path(p).name for p in parts_b] == (["output.h5"] if shared else [Path(p).name for p in parts_a])
            assert np.array_equal(ga["output"][...], gb["output"][...])
