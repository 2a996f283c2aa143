"""What a results file can be trusted for across runs: one file under one name (no symbolic links), resumed
cases complete for their pass, the code that computed each case, refusals that name their cause, and which of
two equal cases report keeps."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import h5py
import pytest

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


# item 1: a results file is written only under its own name ----------------------------------------------------

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


# item 2: a resumed case is complete for its pass ------------------------------------------------------------------

def test_resume_runs_again_a_forward_backward_case_whose_gradients_are_missing(here, capsys):
    assert cli(capsys, "run", "bwd.toml", "-o", "r.h5")[0] == 0
    with h5py.File(here / "r.h5", "a") as f:
        del f["cases/0001-g/grad_k"]                   # a file of an earlier version, or a damaged one
    from hilbert_hpc.study.parts import output_notes

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
