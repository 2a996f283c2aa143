"""No silent mixing or loss: parts belong to one results file and carry checksums, inputs are fingerprinted,
a refused --overwrite changes nothing, and output names too long for the file system are one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from jobtext import DROP
from test_ownership import JOB, OWN_JOB, digest, one_error_line, outputs, run

ROOT = Path(__file__).resolve().parents[1]


def start(args: list[str], cwd: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "hilbert_hpc", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def report(cwd: Path, *files: str) -> subprocess.CompletedProcess:
    return run(["report", *files], cwd)


def notes_of(res: subprocess.CompletedProcess) -> list[str]:
    return [line for line in res.stdout.splitlines() if line.startswith("note:")]


@pytest.fixture
def two_jobs(tmp_path: Path) -> tuple[Path, Path]:
    """JOB and the same job with another seed (other inputs, so other outputs)."""
    (tmp_path / "a.toml").write_text(JOB)
    (tmp_path / "b.toml").write_text(OWN_JOB.but(seed=7).text())
    return tmp_path / "a.toml", tmp_path / "b.toml"


@pytest.fixture
def done(tmp_path: Path) -> Path:
    (tmp_path / "job.toml").write_text(JOB)
    res = run(["run", "job.toml", "-o", "r.h5"], tmp_path)
    assert res.returncode == 0, res.stderr
    return tmp_path / "r.h5"


# 1. a parts folder belongs to exactly one results file -----------------------------------------------------------

def test_results_files_that_share_a_stem_keep_their_own_outputs(tmp_path, two_jobs):
    """x.h5, x.hdf5 and x: each its own parts folder; the second and third run leave x.h5's outputs alone."""
    assert run(["run", "a.toml", "-o", "x.h5"], tmp_path).returncode == 0
    mine = outputs(tmp_path / "x.h5")
    before = digest(tmp_path / "x.h5", tmp_path / "x.h5.parts")
    for name in ("x.hdf5", "x"):
        res = run(["run", "b.toml", "-o", name], tmp_path)
        assert res.returncode == 0, res.stderr
        assert (tmp_path / f"{name}.parts").is_dir()
    res = run(["run", "b.toml", "-o", "x.hdf5", "--overwrite"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert digest(tmp_path / "x.h5", tmp_path / "x.h5.parts") == before
    again = outputs(tmp_path / "x.h5")
    assert all(np.array_equal(mine[c], again[c]) for c in mine)
    theirs = outputs(tmp_path / "x")
    assert not any(np.array_equal(mine[c], theirs[c]) for c in mine)
    res = run(["run", "a.toml", "-o", "x.h5", "--resume"], tmp_path)
    assert res.returncode == 0 and res.stdout.count("skipped") == 4, res.stderr
    for name in ("x.h5", "x.hdf5", "x"):
        assert not notes_of(report(tmp_path, name)), name


def test_two_jobs_at_once_on_names_with_one_stem_never_exchange_outputs(tmp_path, two_jobs):
    (tmp_path / "d").mkdir()
    for job, name in (("a.toml", "ref-a.h5"), ("b.toml", "ref-b.h5")):
        assert run(["run", job, "-o", name], tmp_path).returncode == 0
    first, second = start(["run", "a.toml", "-o", "d/x.h5"], tmp_path), start(["run", "b.toml", "-o", "d/x"], tmp_path)
    for proc in (first, second):
        proc.communicate(timeout=600)
        assert proc.returncode == 0
    for ref, name in (("ref-a.h5", "d/x.h5"), ("ref-b.h5", "d/x")):
        want, got = outputs(tmp_path / ref), outputs(tmp_path / name)
        assert sorted(want) == sorted(got) and all(np.array_equal(want[c], got[c]) for c in want), name


def test_a_part_of_another_results_file_is_not_accepted(tmp_path, two_jobs):
    """A part copied in from another file (same case, same shape) is named by report and rerun by resume."""
    for job, name in (("a.toml", "r.h5"), ("b.toml", "s.h5")):
        assert run(["run", job, "-o", name], tmp_path).returncode == 0
    full = outputs(tmp_path / "r.h5")
    part = "0001-g/rank00000.h5"
    shutil.copy(tmp_path / "s.h5.parts" / part, tmp_path / "r.h5.parts" / part)
    res = report(tmp_path, "r.h5")
    assert res.returncode == 0, res.stderr
    assert notes_of(res) == [f"note: 'r.h5', case 0001-g: output part r.h5.parts/{part} belongs to another results "
                             f"file or case; its saved output cannot be trusted (NaN where a part is missing); its "
                             f"timings and accuracy are unaffected"]
    res = run(["run", "a.toml", "-o", "r.h5", "--resume"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert f"case 0001-g: output part r.h5.parts/{part} belongs to another results file or case; it runs again" \
        in res.stderr and res.stdout.count("skipped") == 3
    again = outputs(tmp_path / "r.h5")
    assert all(np.array_equal(full[c], again[c]) for c in full)


def test_a_parts_folder_of_another_results_file_is_refused_on_resume(tmp_path, done):
    (tmp_path / "r.h5.parts" / "OWNER").write_text("results_id 0123\n")
    before = digest(tmp_path)
    one_error_line(run(["run", "job.toml", "-o", "r.h5", "--resume"], tmp_path), "r.h5.parts", "does not belong to")
    assert digest(tmp_path) == before


@pytest.mark.parametrize("flag", [["--resume"], ["--overwrite"]])
def test_a_parts_folder_that_is_a_link_is_refused_and_changes_nothing(tmp_path, done, flag):
    (tmp_path / "r.h5.parts").rename(tmp_path / "elsewhere")
    (tmp_path / "r.h5.parts").symlink_to("elsewhere")
    before = digest(tmp_path / "r.h5", tmp_path / "elsewhere")
    one_error_line(run(["run", "job.toml", "-o", "r.h5", *flag], tmp_path), "r.h5.parts", "symbolic link")
    assert digest(tmp_path / "r.h5", tmp_path / "elsewhere") == before
    assert (tmp_path / "r.h5.parts").is_symlink()


def test_results_of_the_previous_version_stay_readable(tmp_path, done):
    """Earlier files: parts in <stem>.parts, no results_id, no checksums. report reads them without a note;
    resume reruns their saved outputs (which nothing can verify) and keeps them apart from then on."""
    full = outputs(done)
    (tmp_path / "r.h5.parts").rename(tmp_path / "r.parts")
    with h5py.File(done, "a") as f:
        del f.attrs["results_id"]
        for cid, g in f["cases"].items():
            shape, dtype = g["output"].shape, g["output"].dtype
            del g["output"]
            layout = h5py.VirtualLayout(shape=shape, dtype=dtype)
            layout[...] = h5py.VirtualSource(f"r.parts/{cid}/rank00000.h5", "output", shape=shape)
            ds = g.create_virtual_dataset("output", layout, fillvalue=np.nan)
            ds.attrs["parts"] = json.dumps([f"r.parts/{cid}/rank00000.h5"])
    (tmp_path / "r.parts" / "OWNER").unlink()
    assert all(np.array_equal(full[c], o) for c, o in outputs(done).items())
    res = report(tmp_path, "r.h5")
    assert res.returncode == 0 and "4 case(s)" in res.stdout and not notes_of(res), res.stdout + res.stderr
    (tmp_path / "r.parts" / "0002-g" / "rank00000.h5").unlink()
    assert notes_of(report(tmp_path, "r.h5")) == [
        "note: 'r.h5', case 0002-g: output part r.parts/0002-g/rank00000.h5 is missing; its saved output cannot be "
        "trusted (NaN where a part is missing); its timings and accuracy are unaffected"]
    res = run(["run", "job.toml", "-o", "r.h5", "--resume"], tmp_path)
    assert res.returncode == 0 and res.stdout.count("skipped") == 0, res.stderr
    assert "carry no checksum" in res.stderr
    again = outputs(done)
    assert all(np.array_equal(full[c], again[c]) for c in full)
    assert not notes_of(report(tmp_path, "r.h5"))


# 4./5. checksums: report names lost and damaged outputs, resume reruns them ----------------------------------------

def _damage(part: Path) -> None:
    with h5py.File(part, "a") as f:
        f["output"][0, 3, 1, 2] += 1.0


def test_report_names_each_case_with_a_lost_or_damaged_output(tmp_path, done):
    assert not notes_of(report(tmp_path, "r.h5"))
    (tmp_path / "r.h5.parts" / "0000-g" / "rank00000.h5").unlink()
    _damage(tmp_path / "r.h5.parts" / "0003-g" / "rank00000.h5")
    res = report(tmp_path, "r.h5")
    assert res.returncode == 0, res.stderr
    notes = notes_of(res)
    assert len(notes) == 2
    assert notes[0].startswith("note: 'r.h5', case 0000-g: output part r.h5.parts/0000-g/rank00000.h5 is missing;")
    assert notes[1].startswith("note: 'r.h5', case 0003-g: output part r.h5.parts/0003-g/rank00000.h5 is damaged "
                               "(its data does not match the SHA-256 the case recorded)")


def test_resume_reruns_a_case_whose_part_is_damaged(tmp_path, done):
    full = outputs(done)
    _damage(tmp_path / "r.h5.parts" / "0002-g" / "rank00000.h5")
    res = run(["run", "job.toml", "-o", "r.h5", "--resume"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("skipped") == 3
    assert "case 0002-g: output part r.h5.parts/0002-g/rank00000.h5 is damaged" in res.stderr
    again = outputs(done)
    assert all(np.array_equal(full[c], again[c]) for c in full)


def test_one_function_checks_the_outputs_for_resume_and_report(done):
    from hilbert_hpc.study.parts import output_problem

    with h5py.File(done, "r") as f:
        rid = f.attrs["results_id"]
        group = f["cases/0001-g"]
        assert output_problem(group, done, rid) is None
        digests = json.loads(group["output"].attrs["part_sha256"])
        with h5py.File(done.parent / "r.h5.parts/0001-g/rank00000.h5", "r") as part:
            ds = part["output"]
            assert ds.attrs["results_id"] == rid and ds.attrs["case_id"] == "0001-g"
            assert json.loads(ds.attrs["sha256"]) == digests
        assert output_problem(group, done, "another") == ("output part r.h5.parts/0001-g/rank00000.h5 belongs to "
                                                          "another results file or case")


# 3. (issue item 4) resume notices a changed input file ------------------------------------------------------------

@pytest.fixture
def with_input(tmp_path: Path) -> Path:
    from hilbert_hpc.distributed.datafile import write_input

    rng = np.random.default_rng(0)
    write_input(tmp_path / "data.h5", *(rng.standard_normal((256, 2, 8)) for _ in range(3)), grid=(16, 16))
    (tmp_path / "job.toml").write_text(OWN_JOB.but(case={"grid": DROP, "input": "data.h5"}).text())
    res = run(["run", "job.toml", "-o", "r.h5"], tmp_path)
    assert res.returncode == 0, res.stderr
    return tmp_path / "data.h5"


def test_resume_refuses_an_input_file_that_changed(tmp_path, with_input):
    with h5py.File(with_input, "a") as f:
        f["v"][5, 1, 3] = 0.25
    before = digest(tmp_path)
    one_error_line(run(["run", "job.toml", "-o", "r.h5", "--resume"], tmp_path), "input file",
                   "data.h5", "of case 0000-g has changed")
    assert digest(tmp_path) == before


def test_resume_with_the_same_input_keeps_every_case(tmp_path, with_input):
    with h5py.File(tmp_path / "r.h5", "r") as f:
        assert {g.attrs["input_sha256"] for g in f["cases"].values()} == {
            __import__("hashlib").sha256(with_input.read_bytes()).hexdigest()}
    res = run(["run", "job.toml", "-o", "r.h5", "--resume"], tmp_path)
    assert res.returncode == 0 and res.stdout.count("skipped") == 4, res.stderr


# 2. (issue item 3) a refused --overwrite leaves the old file as it was ----------------------------------------------

def test_overwrite_refused_at_read_time_leaves_the_old_file_bit_identical(tmp_path, with_input):
    with h5py.File(with_input, "a") as f:
        f["q"][7, 0, 1] = np.nan
    before = digest(tmp_path / "r.h5", tmp_path / "r.h5.parts")
    one_error_line(run(["run", "job.toml", "-o", "r.h5", "--overwrite"], tmp_path), "data.h5", "finite")
    assert digest(tmp_path / "r.h5", tmp_path / "r.h5.parts") == before
    assert not list(tmp_path.glob("*.lock")) and not list(tmp_path.glob(".*.tmp-*"))


def test_overwrite_replaces_the_old_file_once_a_case_is_committed(tmp_path, done):
    with h5py.File(done, "r") as f:
        old_id = f.attrs["results_id"]
    res = run(["run", "job.toml", "-o", "r.h5", "--overwrite"], tmp_path)
    assert res.returncode == 0, res.stderr
    with h5py.File(done, "r") as f:
        assert f.attrs["results_id"] != old_id
    assert (tmp_path / "r.h5.parts" / "OWNER").read_text().split()[-1] != old_id
    assert not notes_of(report(tmp_path, "r.h5"))


def test_a_stop_before_the_first_commit_of_an_overwrite_says_the_old_file_is_unchanged(tmp_path, done, monkeypatch):
    """Stopped (SIGUSR1) before an --overwrite run commits anything: the old file is as it was, and the message
    says to run again with --overwrite, not to --resume it (that would keep the cases meant to be replaced)."""
    import io
    import signal

    from hilbert_hpc.study import runner
    from hilbert_hpc.study.jobfile import load_job
    from hilbert_hpc.study.signals import StoppedForRequeue
    from hilbert_hpc.study.table import SummaryTable

    before = digest(done, tmp_path / "r.h5.parts")
    monkeypatch.setattr(SummaryTable, "header", lambda self: os.kill(os.getpid(), signal.SIGUSR1))
    with pytest.raises(StoppedForRequeue) as info:
        runner.run_job(load_job(tmp_path / "job.toml"), output=str(done), overwrite=True, stream=io.StringIO(),
                       progress=io.StringIO())
    assert "is unchanged; run again with --overwrite" in str(info.value) and "--resume" not in str(info.value)
    assert digest(done, tmp_path / "r.h5.parts") == before

# 6. names longer than the file system allows ----------------------------------------------------------------------

@pytest.mark.parametrize("length", [247, 250, 300])      # 247: only "<name>.parts" is too long
def test_an_output_name_too_long_for_the_file_system_is_one_line(tmp_path, length):
    (tmp_path / "job.toml").write_text(JOB)
    name = "a" * length + ".h5"
    one_error_line(run(["run", "job.toml", "-o", name], tmp_path), "is too long", "at most")
    one_error_line(run(["bandwidth", "--max-bytes", "1024", "-o", name], tmp_path), "is too long")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.toml"]


def test_every_derived_name_is_checked():
    from hilbert_hpc.study.output_files import OutputError, check_name_length, derived_names, name_max

    limit = name_max(Path("."))
    for suffix_room in (len(".lock"), len(".parts")):
        check_name_length(Path("a" * (limit - 40)), [".parts"])
        with pytest.raises(OutputError, match="too long"):
            check_name_length(Path("a" * (limit - suffix_room + 1)), [".parts"])
    names = derived_names(Path("x.h5"), [".parts"])
    assert set(names.values()) >= {"x.h5.lock", "x.h5.parts"} and any(".tmp-" in n for n in names.values())


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="needs mpiexec")
def test_checksums_of_every_rank_block_under_mpiexec(tmp_path):
    """On 2 ranks each rank's block is checksummed: damage in rank 1's part is named and rerun."""
    (tmp_path / "job.toml").write_text(OWN_JOB.but(defaults={"ranks": 2}).text())
    res = run(["run", "job.toml", "-o", "r.h5"], tmp_path, mpi=2)
    assert res.returncode == 0, res.stderr
    full = outputs(tmp_path / "r.h5")
    assert not notes_of(report(tmp_path, "r.h5"))
    with h5py.File(tmp_path / "r.h5", "r") as f:
        parts = json.loads(f["cases/0001-g/output"].attrs["parts"])
        assert len(json.loads(f["cases/0001-g/output"].attrs["part_sha256"])) == 2
    _damage(tmp_path / parts[-1])
    notes = notes_of(report(tmp_path, "r.h5"))
    assert len(notes) == 1 and f"case 0001-g: output part {parts[-1]} is damaged" in notes[0]
    res = run(["run", "job.toml", "-o", "r.h5", "--resume"], tmp_path, mpi=2)
    assert res.returncode == 0 and res.stdout.count("skipped") == 3, res.stderr
    again = outputs(tmp_path / "r.h5")
    assert all(np.array_equal(full[c], again[c]) for c in full)
