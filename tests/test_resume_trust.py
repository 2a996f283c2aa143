"""What a results file can be trusted for across runs: one file under one name (no symbolic links), resumed
cases complete for their pass, the code that computed each case, refusals that name their cause, and which of
two equal cases report keeps."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import h5py
import pytest

from hilbert_hpc.study.parts import output_notes
from hilbert_hpc.study.report import report

from jobtext import QUICK, JobSpec

TRUST_JOB = JobSpec({"name": "trust", **QUICK, "save_output": True},
                    defaults={"heads": 2, "head_dim": 8, "dtype": "float64"},
                    cases=[{"name": "g", "grid": [16, 16], "patterns": [[64, 1], [256, 4]],
                            "sweep": {"scale": [0.1, 0.2]}}])
BACKWARD_JOB = TRUST_JOB.but(case={"pass": "forward+backward"})


def cli(capsys, *args: str) -> tuple[int, list[str]]:
    """Run the command line in this process: its exit code and the lines of ours on stderr."""
    from hilbert_hpc import cli as entry

    code = entry.main(list(args))
    return code, [line for line in capsys.readouterr().err.splitlines() if line.startswith("hilbert-hpc")]


def digest(*paths: Path) -> dict[str, str]:
    """SHA-256 of every file under ``paths`` (what must not change)."""
    files = [q for p in paths for q in (sorted(p.rglob("*")) if p.is_dir() else [p]) if q.is_file()]
    return {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


@pytest.fixture
def here(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.toml").write_text(TRUST_JOB.text())
    (tmp_path / "bwd.toml").write_text(BACKWARD_JOB.text())
    return tmp_path


def unfinish(path: Path, cid: str) -> None:
    """Mark a case unfinished, as a run stopped while writing it leaves it."""
    with h5py.File(path, "a") as f:
        f["cases"][cid].attrs["complete"] = False


# one file, one name: no output through a symbolic link ----------------------------------------------------------------

@pytest.mark.parametrize("flags", [["--resume"], ["--overwrite"], []])
def test_an_output_that_is_a_symbolic_link_is_refused_and_changes_nothing(here, capsys, flags):
    assert cli(capsys, "run", "job.toml", "-o", "x.h5")[0] == 0
    (here / "a.h5").symlink_to("x.h5")
    before = digest(here)
    code, err = cli(capsys, "run", "job.toml", "-o", "a.h5", *flags)
    assert code == 2 and len(err) == 1, err
    assert "'a.h5' is a symbolic link (to 'x.h5')" in err[0] and "-o x.h5" in err[0]
    assert (here / "a.h5").is_symlink() and digest(here) == before
    assert not (here / "a.h5.parts").exists() and not (here / "a.h5.lock").exists()


def test_a_dangling_link_is_refused_too(here, capsys):
    (here / "a.h5").symlink_to("nowhere.h5")
    code, err = cli(capsys, "run", "job.toml", "-o", "a.h5")
    assert code == 2 and "'a.h5' is a symbolic link (to 'nowhere.h5')" in err[0]
    assert (here / "a.h5").is_symlink() and not (here / "nowhere.h5").exists()


def test_a_linked_folder_above_the_output_is_followed(here, capsys):
    """A link to the folder (a scratch file system) names the same lock, parts folder and file."""
    (here / "real").mkdir()
    (here / "linked").symlink_to("real")
    assert cli(capsys, "run", "job.toml", "-o", "linked/r.h5")[0] == 0
    unfinish(here / "real" / "r.h5", "0001-g")
    assert cli(capsys, "run", "job.toml", "-o", "real/r.h5", "--resume")[0] == 0
    assert (here / "real" / "r.h5.parts").is_dir() and not (here / "real" / "r.h5").is_symlink()


def test_other_outputs_refuse_a_link_too(here, capsys):
    (here / "bw.h5").symlink_to("elsewhere.h5")
    code, err = cli(capsys, "bandwidth", "--max-bytes", "1KiB", "-o", "bw.h5")
    assert code == 2 and "'bw.h5' is a symbolic link" in err[0]
    assert not (here / "elsewhere.h5").exists()
    assert cli(capsys, "run", "job.toml", "-o", "r.h5")[0] == 0
    (here / "r.csv").symlink_to("elsewhere.csv")
    code, err = cli(capsys, "report", "r.h5", "--csv", "r.csv")
    assert code == 2 and err == ["hilbert-hpc: error: --csv: 'r.csv' is a symbolic link (to 'elsewhere.csv'); an "
                                 "output is written only under its own name, never through a link: choose another "
                                 "--csv"]
    assert not (here / "elsewhere.csv").exists()


# a kept case holds what its pass saves --------------------------------------------------------------------------------

def test_resume_runs_again_a_forward_backward_case_whose_gradients_are_missing(here, capsys):
    assert cli(capsys, "run", "bwd.toml", "-o", "r.h5")[0] == 0
    with h5py.File(here / "r.h5", "a") as f:
        del f["cases/0001-g/grad_k"]                   # a file of an earlier version, or a damaged one
    assert output_notes(here / "r.h5") == [f"{str(here / 'r.h5')!r}, case 0001-g: its saved grad_k is missing; its "
                                           f"saved output cannot be trusted (NaN where a part is missing); its "
                                           f"timings and accuracy are unaffected"]
    code, err = cli(capsys, "run", "bwd.toml", "-o", "r.h5", "--resume")
    assert code == 0, err
    assert "hilbert-hpc: note: case 0001-g: its saved grad_k is missing; it runs again" in err
    with h5py.File(here / "r.h5") as f:
        for cid in ("0000-g", "0001-g"):
            assert all(name in f["cases"][cid] for name in ("output", "grad_q", "grad_k", "grad_v"))
        assert f["cases/0001-g/grad_k"][...].shape == (1, 256, 2, 8)


def test_one_definition_of_what_a_case_saves():
    from hilbert_hpc.study import record as rec

    assert rec.saved_datasets("forward") == ("output",)
    assert rec.saved_datasets("forward+backward") == ("output", "grad_q", "grad_k", "grad_v") == rec.SAVED


# the code that computed each case -------------------------------------------------------------------------------------

def as_version(monkeypatch, version: str, commit: str) -> None:
    """Make this process's runs record ``version`` and ``commit`` as the code they run."""
    from hilbert_hpc.study import provenance

    monkeypatch.setattr(provenance, "__version__", version)
    monkeypatch.setattr(provenance, "git_hash", lambda: commit)


def test_a_resume_by_other_code_records_the_code_of_each_case(here, capsys, monkeypatch):
    as_version(monkeypatch, "1.0", "aaaa")
    assert cli(capsys, "run", "job.toml", "-o", "r.h5")[0] == 0
    unfinish(here / "r.h5", "0001-g")
    as_version(monkeypatch, "1.1", "bbbb")
    assert cli(capsys, "run", "job.toml", "-o", "r.h5", "--resume")[0] == 0
    with h5py.File(here / "r.h5") as f:
        assert (f.attrs["version"], f.attrs["git_hash"]) == ("1.0", "aaaa")          # the first run's
        cases = f["cases"]
        assert (cases["0000-g"].attrs["version"], cases["0000-g"].attrs["git_hash"]) == ("1.0", "aaaa")
        assert (cases["0001-g"].attrs["version"], cases["0001-g"].attrs["git_hash"]) == ("1.1", "bbbb")
        (resumed,) = json.loads(f.attrs["resumes"])
        assert (resumed["version"], resumed["git_hash"]) == ("1.1", "bbbb")
    tables = report(["r.h5"], csv_path="r.csv")
    assert [(r["case"], r["version"], r["git_hash"]) for r in tables["cases"]] == [
        ("0000-g", "1.0", "aaaa"), ("0001-g", "1.1", "bbbb")]
    assert "'r.h5': its cases were computed by 2 versions of the code: 1.0 (git aaaa): 0000-g; " \
           "1.1 (git bbbb): 0001-g" in tables["notes"]
    assert "version" in (here / "r.csv").read_text().splitlines()[0].split(",")


def test_cases_of_older_files_read_the_root_version(here, capsys, monkeypatch):
    as_version(monkeypatch, "0.9", "cccc")
    assert cli(capsys, "run", "job.toml", "-o", "r.h5")[0] == 0
    with h5py.File(here / "r.h5", "a") as f:
        for group in f["cases"].values():
            del group.attrs["version"], group.attrs["git_hash"]
    tables = report(["r.h5"])
    assert {(r["version"], r["git_hash"]) for r in tables["cases"]} == {("0.9", "cccc")}
    assert not any("versions of the code" in n for n in tables["notes"])


# another rank count: the refusal names it -----------------------------------------------------------------------------

def test_resuming_a_pow2_file_on_another_rank_count_names_the_rank_count(here):
    from hilbert_hpc.study.jobfile import load_job
    from hilbert_hpc.study.output_files import OutputError
    from hilbert_hpc.study.provenance import provenance
    from hilbert_hpc.study.results import ResultsFile
    from hilbert_hpc.study.runner import run_job

    spec = TRUST_JOB.but(defaults={"ranks": "pow2"}, case={"sweep": {"causal": [False, True]}})
    (here / "pow2.toml").write_text(spec.text())
    run_job(load_job("pow2.toml", world_size=1), "r.h5", stream=io.StringIO())
    before = digest(here)
    job = load_job("pow2.toml", world_size=2)               # cases 0000 (1 rank), 0001 (2 ranks), 0002 ...
    with pytest.raises(OutputError) as err:
        ResultsFile.open("r.h5", job, dict(provenance(), ranks=2), resume=True)
    assert str(err.value) == ("output: cannot resume 'r.h5': it was run on 1 rank, this run has 2, which gives job "
                              "'trust' other cases (case 0001-g has ranks = 1 in the file, 2 in this run); resume on "
                              "1 rank, or write to another file with -o")
    assert digest(here) == before


# report keeps the case that finished later ----------------------------------------------------------------------------

def finished(path: Path, when: str) -> None:
    with h5py.File(path, "a") as f:
        for group in f["cases"].values():
            group.attrs["finished_utc"] = when


def test_report_keeps_the_case_that_finished_later_whatever_the_order_of_the_files(here, capsys):
    assert cli(capsys, "run", "job.toml", "-o", "new.h5")[0] == 0
    assert cli(capsys, "run", "job.toml", "-o", "old.h5")[0] == 0
    finished(here / "new.h5", "2030-01-02T00:00:00+00:00")
    finished(here / "old.h5", "2030-01-01T00:00:00+00:00")
    for order in (["new.h5", "old.h5"], ["old.h5", "new.h5"]):
        tables = report(order)
        assert [(r["case"], r["file"]) for r in tables["cases"]] == [("0000-g", "new.h5"), ("0001-g", "new.h5")]
        assert any("keeping the one that finished later ('new.h5', 0000-g, finished 2030-01-02T00:00:00+00:00)"
                   in n for n in tables["notes"]), tables["notes"]


def test_report_without_finish_times_keeps_the_file_given_last_and_says_so(here, capsys):
    assert cli(capsys, "run", "job.toml", "-o", "a.h5")[0] == 0
    assert cli(capsys, "run", "job.toml", "-o", "b.h5")[0] == 0
    for name in ("a.h5", "b.h5"):
        with h5py.File(here / name, "a") as f:
            for group in f["cases"].values():
                del group.attrs["finished_utc"]
    tables = report(["b.h5", "a.h5"])
    assert {r["file"] for r in tables["cases"]} == {"a.h5"}
    assert any("keeping the one of the file given later ('a.h5', 0000-g): no finish time to tell which ran later"
               in n for n in tables["notes"]), tables["notes"]
