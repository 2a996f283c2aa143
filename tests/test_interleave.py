"""[job] interleave = true: call r of every case on a rank count runs before call r+1 of any of them."""

from __future__ import annotations

import io
import json
import os
import signal
from pathlib import Path

import h5py
import numpy as np
import pytest

from hilbert_hpc.errors import UserError
from hilbert_hpc.study.jobfile import load_job

from jobtext import JobSpec

STUDY = JobSpec({"name": "mix", "repeats": 3, "warmup": 1, "accuracy_rows": 6, "save_output": True,
                 "interleave": True},
                defaults={"heads": 2, "head_dim": 8, "dtype": "float64"},
                cases=[{"name": "c", "grid": [16, 16], "ranks": "pow2", "patterns": [[64, 1], [256, 8]],
                        "sweep": {"ordering": ["natural", "hilbert"]}}])


def _job(tmp: Path, interleave: bool, world_size: int | None = None):
    return load_job(tmp / "study.toml", text=STUDY.but(interleave=interleave).text(), world_size=world_size)


def _record_calls(monkeypatch) -> list[tuple[str, int]]:
    """Every CaseRun.step of this process, as (case id, call index), in the order they ran."""
    from hilbert_hpc.study.measure import CaseRun

    calls: list[tuple[str, int]] = []
    step = CaseRun.step

    def recording(self):
        calls.append((self.case.case_id, self.rep))
        step(self)

    monkeypatch.setattr(CaseRun, "step", recording)
    return calls


def _cases(path: Path) -> dict[str, dict]:
    """Per case: output, accuracy attributes, timing shapes and the ranks."""
    with h5py.File(path) as f:
        return {cid: {"output": g["output"][...], "accuracy": dict(g["accuracy"].attrs),
                      "shapes": {k: v.shape for k, v in g["timings"].items()}, "ranks": int(g.attrs["ranks"])}
                for cid, g in f["cases"].items()}


def _same_results(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for cid in a:
        assert np.array_equal(a[cid]["output"], b[cid]["output"]), cid
        np.testing.assert_equal(a[cid]["accuracy"], b[cid]["accuracy"], err_msg=cid)   # NaN: no gradients
        assert a[cid]["shapes"] == b[cid]["shapes"], cid
        assert set(a[cid]["shapes"].values()) == {(a[cid]["ranks"], 3)}


def test_calls_alternate_and_results_equal_those_run_in_turn(tmp_path, monkeypatch, capsys):
    from hilbert_hpc.study.runner import run_job

    calls = _record_calls(monkeypatch)
    plain = run_job(_job(tmp_path, False), output=str(tmp_path / "plain.h5"), stream=io.StringIO(),
                    progress=io.StringIO())
    in_turn, calls[:] = list(calls), []
    capsys.readouterr()
    mixed = run_job(_job(tmp_path, True), output=str(tmp_path / "mixed.h5"), stream=io.StringIO(),
                    progress=io.StringIO())
    a, b = "0000-c", "0001-c"
    assert in_turn == [(a, r) for r in range(4)] + [(b, r) for r in range(4)]
    assert calls == [(cid, r) for r in range(4) for cid in (a, b)]          # warm-up first, then the repeats
    _same_results(_cases(plain), _cases(mixed))
    with h5py.File(mixed) as f, h5py.File(plain) as g:
        assert json.loads(f.attrs["job_settings"])["interleave"] is True
        assert json.loads(g.attrs["job_settings"])["interleave"] is False
        assert all(0 < c.attrs["wall_s"] for c in f["cases"].values())
    assert "the 2 cases on 1 rank(s) (0000-c ... 0001-c) run their repeats in turn" in capsys.readouterr().err


def test_a_stop_between_interleaved_repeats_keeps_complete_cases_only_and_resumes(tmp_path, monkeypatch):
    from hilbert_hpc.study.measure import CaseRun
    from hilbert_hpc.study.runner import run_job
    from hilbert_hpc.study.signals import StoppedForRequeue

    reference = run_job(_job(tmp_path, True), output=str(tmp_path / "ref.h5"), stream=io.StringIO(),
                        progress=io.StringIO())
    step = CaseRun.step

    def stopping(self):
        step(self)
        if self.case.case_id == "0000-c" and self.rep == 2:
            os.kill(os.getpid(), signal.SIGUSR1)           # in the middle of the group's repeats

    monkeypatch.setattr(CaseRun, "step", stopping)
    out = tmp_path / "r.h5"
    with pytest.raises(StoppedForRequeue) as info:
        run_job(_job(tmp_path, True), output=str(out), stream=io.StringIO(), progress=io.StringIO())
    assert "between interleaved repeats: 0 of 2 cases are complete" in info.value.message
    assert "the 2 case(s) of the group on 1 rank(s) run again" in info.value.message
    with h5py.File(out) as f:
        assert list(f["cases"]) == []
    monkeypatch.setattr(CaseRun, "step", step)
    run_job(_job(tmp_path, True), output=str(out), stream=io.StringIO(), progress=io.StringIO(), resume=True)
    _same_results(_cases(reference), _cases(out))


def test_a_failed_write_ends_the_group_with_the_cases_before_it_complete(tmp_path, monkeypatch):
    from hilbert_hpc.study.results import ResultsFile
    from hilbert_hpc.study.runner import run_job

    write = ResultsFile.write_case

    def failing(self, case, *args, **kwargs):
        if case.case_id == "0001-c":
            raise UserError("cannot write results file: No space left on device", "r.h5")
        return write(self, case, *args, **kwargs)

    monkeypatch.setattr(ResultsFile, "write_case", failing)
    out = tmp_path / "r.h5"
    with pytest.raises(UserError, match="No space left"):
        run_job(_job(tmp_path, True), output=str(out), stream=io.StringIO(), progress=io.StringIO())
    with h5py.File(out) as f:
        assert list(f["cases"]) == ["0000-c"] and f["cases/0000-c"].attrs["complete"]


@pytest.mark.mpi(min_size=2)
def test_groups_by_rank_count_agree_with_cases_run_in_turn(tmp_path_factory, monkeypatch):
    """On P ranks: one group per rank count (1, 2, 4 ...); a rank that sits a group out only agrees on its
    boundaries; outputs and accuracy equal those of the cases run in turn."""
    from mpi4py import MPI

    from hilbert_hpc.study.runner import run_job

    comm = MPI.COMM_WORLD
    tmp = Path(comm.bcast(str(tmp_path_factory.mktemp("interleave")) if comm.Get_rank() == 0 else None))
    size = comm.Get_size()
    plain = run_job(_job(tmp, False, size), output=str(tmp / "plain.h5"), stream=io.StringIO(), comm=comm,
                    progress=io.StringIO())
    calls = _record_calls(monkeypatch)
    job = _job(tmp, True, size)
    mixed = run_job(job, output=str(tmp / "mixed.h5"), stream=io.StringIO(), comm=comm, progress=io.StringIO())
    counts = [p for p in (1, 2, 4, 8) if p <= size]
    expected = []
    for p in counts:
        if comm.Get_rank() < p:
            ids = [c.case_id for c in job.cases if c.ranks == p]
            assert len(ids) == 2
            expected += [(cid, r) for r in range(4) for cid in ids]
    assert calls == expected
    comm.Barrier()
    if comm.Get_rank() == 0:
        _same_results(_cases(plain), _cases(mixed))


@pytest.mark.mpi(min_size=2)
def test_stops_on_one_rank_end_every_rank_at_a_group_or_repeat_boundary(tmp_path_factory, monkeypatch):
    """A stop asked while a group's cases are written waits for the group (its cases are complete); one asked
    between repeats drops the group; resuming then gives what an uninterrupted run gives."""
    from mpi4py import MPI

    from hilbert_hpc.study import runner
    from hilbert_hpc.study.measure import CaseRun
    from hilbert_hpc.study.signals import StoppedForRequeue

    comm = MPI.COMM_WORLD
    rank0 = comm.Get_rank() == 0
    tmp = Path(comm.bcast(str(tmp_path_factory.mktemp("stops")) if rank0 else None))
    job = _job(tmp, True, comm.Get_size())
    total = len(job.cases)
    reference = runner.run_job(job, output=str(tmp / "ref.h5"), stream=io.StringIO(), comm=comm,
                               progress=io.StringIO())
    out = str(tmp / "r.h5")
    write, step = runner.run_case, CaseRun.step

    def stop_in_write(setup, *args, **kwargs):
        if rank0 and setup.case.case_id == "0000-c":
            os.kill(os.getpid(), signal.SIGUSR1)
        return write(setup, *args, **kwargs)

    monkeypatch.setattr(runner, "run_case", stop_in_write)
    with pytest.raises(StoppedForRequeue) as info:
        runner.run_job(job, output=out, stream=io.StringIO(), comm=comm, progress=io.StringIO())
    assert f"at a case boundary: 2 of {total} cases are complete" in info.value.message
    monkeypatch.setattr(runner, "run_case", write)

    def stop_in_repeats(self):
        step(self)
        if rank0 and self.case.ranks == 2 and self.rep == 1:
            os.kill(os.getpid(), signal.SIGUSR1)

    monkeypatch.setattr(CaseRun, "step", stop_in_repeats)
    with pytest.raises(StoppedForRequeue) as info:
        runner.run_job(job, output=out, stream=io.StringIO(), comm=comm, progress=io.StringIO(), resume=True)
    assert f"between interleaved repeats: 2 of {total} cases are complete" in info.value.message
    monkeypatch.setattr(CaseRun, "step", step)
    runner.run_job(job, output=out, stream=io.StringIO(), comm=comm, progress=io.StringIO(), resume=True)
    comm.Barrier()
    if rank0:
        _same_results(_cases(reference), _cases(Path(out)))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("interleave", [False, True])
def test_an_accuracy_read_failing_on_one_rank_ends_every_rank(tmp_path_factory, monkeypatch, interleave):
    """An input that cannot be read back for the accuracy check on one rank (changed or damaged during the run)
    is one error on every rank, not a rank waiting in the next collective while the others wait in another."""
    from mpi4py import MPI

    from hilbert_hpc.study import measure, runner
    from hilbert_hpc.errors import ConfigError

    comm = MPI.COMM_WORLD
    tmp = Path(comm.bcast(str(tmp_path_factory.mktemp("accuracy-error")) if comm.Get_rank() == 0 else None))
    checked = measure.local_accuracy

    def failing_on_rank_1(case, seed, rows, output, layout, rank):
        if comm.Get_rank() == 1:
            raise ConfigError("cannot read 'in.h5': it changed during the run", "input")
        return checked(case, seed, rows, output, layout, rank)

    monkeypatch.setattr(measure, "local_accuracy", failing_on_rank_1)  # where CaseRun looks it up
    with pytest.raises(UserError, match="changed during the run"):
        runner.run_job(_job(tmp, interleave, comm.Get_size()), output=str(tmp / f"r{interleave}.h5"),
                       stream=io.StringIO(), comm=comm, progress=io.StringIO())
