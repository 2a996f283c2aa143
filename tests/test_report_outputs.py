"""What a report writes (CSV, plots) follows run's ownership rules, and bandwidth files carry provenance and are
reported.

Every refusal comes before anything is printed, is one line, and leaves every file as it was.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from clirun import run_in_process
from hilbert_hpc.errors import UserError
from hilbert_hpc.study.output_files import OutputLock
from hilbert_hpc.study.report import report
from hilbert_hpc.study.parts import parts_dir
from test_report import make_case, timings, write_results

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                OMP_NUM_THREADS="1")


def cli(args: list[str], cwd: Path, mpi: int = 0) -> subprocess.CompletedProcess:
    """``hilbert-hpc ARGS`` in ``cwd``: in this process, or under ``mpiexec -n MPI``."""
    if not mpi:
        return run_in_process(args, cwd)
    cmd = [sys.executable, "-m", "hilbert_hpc", *args]
    if mpi:
        cmd = ["mpiexec", "-n", str(mpi), "--oversubscribe", *cmd]
    return subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)


def digest(folder: Path) -> dict[str, str]:
    """SHA-256 of every file under ``folder`` (what a refused report must leave as it was)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def study(tmp_path: Path) -> dict[str, Path]:
    """A results file naming a job file and an input file, with a parts folder (and an older one it points to)."""
    rng = np.random.default_rng(0)
    job = tmp_path / "job.toml"
    job.write_text("[job]\nname = 'x'\n")
    data = tmp_path / "inputs.h5"
    with h5py.File(data, "w") as f:
        f["q"] = np.zeros(4)
    cases = [make_case(f"s{p}", timings(rng, p, 1.0 / p), input=str(data)) for p in (1, 2)]
    results = Path(write_results(tmp_path / "r.h5", cases))
    with h5py.File(results, "a") as f:
        f.attrs["job_path"] = "job.toml"                  # as given to run: relative to where it ran
        f["cases/s1"].create_dataset("output", data=np.zeros(2)).attrs["parts"] = json.dumps(["old.parts/s1/rank0.h5"])
    for folder in (parts_dir(results) / "s1", tmp_path / "old.parts" / "s1"):
        folder.mkdir(parents=True)
        (folder / "rank0.h5").write_bytes(b"part")
    return {"dir": tmp_path, "results": results, "job": job, "input": data}


def refused(paths, option: str, *needles: str, **kw) -> None:
    """The report raises one UserError naming ``option`` before printing anything."""
    out = io.StringIO()
    with pytest.raises(UserError) as info:
        report(paths, stream=out, **kw)
    message = str(info.value)
    assert message.startswith(f"{option}: ") and "\n" not in message, message
    for needle in needles:
        assert needle in message, message
    assert out.getvalue() == ""


@pytest.mark.parametrize("name, needle", [("r.h5", "is the file given to report"),
                                          ("job.toml", "is the job file of"),
                                          ("inputs.h5", "is the input file of case"),
                                          ("r.h5.parts/s1/rank0.h5", "output parts folder"),
                                          ("old.parts/s1/rank0.h5", "output parts folder"),
                                          ("old.parts/new.csv", "output parts folder")])
def test_csv_never_replaces_what_the_results_own_or_name(study, monkeypatch, name, needle):
    monkeypatch.chdir(study["dir"])
    if name.startswith("r.h5.parts"):
        name = str((parts_dir(study["results"]) / "s1" / "rank0.h5").relative_to(study["dir"]))
    before = digest(study["dir"])
    for flags in ({}, {"overwrite": True}):
        refused([study["results"]], "--csv", needle, csv_path=name, **flags)
    assert digest(study["dir"]) == before


def test_csv_refuses_other_files_and_replaces_its_own_only_with_overwrite(study, monkeypatch):
    monkeypatch.chdir(study["dir"])
    notes = study["dir"] / "notes.csv"
    notes.write_text("table,file\nmy own data,1\n")
    before = digest(study["dir"])
    refused([study["results"]], "--csv", "not a CSV file written by hilbert-hpc report", csv_path=notes)
    refused([study["results"]], "--csv", "not a CSV file written by hilbert-hpc report", csv_path=notes,
            overwrite=True)
    refused([study["results"]], "--csv", "is a folder", csv_path=study["dir"])
    assert digest(study["dir"]) == before
    mine = study["dir"] / "out" / "report.csv"
    report([study["results"]], stream=io.StringIO(), csv_path=mine)
    first = mine.read_bytes()
    mine.write_bytes(first.replace(b"s1", b"s9"))     # still a report's CSV: replaced only with --overwrite
    refused([study["results"]], "--csv", "exists; replace it with --overwrite", csv_path=mine)
    assert b"s9" in mine.read_bytes()
    report([study["results"]], stream=io.StringIO(), csv_path=mine, overwrite=True)
    assert mine.read_bytes() == first
    assert sorted(p.name for p in mine.parent.iterdir()) == ["report.csv"]     # no temporary or lock file left


def test_the_csv_is_written_before_the_tables_are_printed(study, monkeypatch):
    """A reader that leaves early (| head) cannot cost the CSV: it is on disk before the first printed line."""
    monkeypatch.chdir(study["dir"])
    target = study["dir"] / "early.csv"

    class LeavingReader(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(BrokenPipeError):
        report([study["results"]], stream=LeavingReader(), csv_path=target)
    assert target.read_text().startswith("table,")


def test_a_csv_of_the_header_alone_is_reports_own(study, monkeypatch):
    """The CSV of a report whose tables have no rows holds the header ``table`` alone: report knows it as its
    own (replaced with --overwrite), not as a stranger's file it may never replace."""
    from hilbert_hpc.study.report_files import is_report_csv

    monkeypatch.chdir(study["dir"])
    target = study["dir"] / "empty.csv"
    target.write_text("table\r\n")
    assert is_report_csv(target)
    refused([study["results"]], "--csv", "exists; replace it with --overwrite", csv_path=target)
    report([study["results"]], stream=io.StringIO(), csv_path=target, overwrite=True)
    assert is_report_csv(target) and target.stat().st_size > 10


def test_csv_in_use_is_refused(study):
    target = study["dir"] / "busy.csv"
    with OutputLock(target):
        refused([study["results"]], "--csv", "in use", "choose another --csv", csv_path=target)
    assert not target.exists()


def test_a_failed_write_leaves_the_old_csv(study, monkeypatch):
    target = study["dir"] / "keep.csv"
    report([study["results"]], stream=io.StringIO(), csv_path=target)
    old = target.read_bytes()

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(csv.DictWriter, "writeheader", fail)
    with pytest.raises(UserError, match="cannot write .*keep.csv.*No space left on device"):
        report([study["results"]], stream=io.StringIO(), csv_path=target, overwrite=True)
    assert target.read_bytes() == old
    assert sorted(p.name for p in study["dir"].iterdir() if "keep" in p.name) == ["keep.csv"]


def test_plots_follow_the_same_rules(study):
    pytest.importorskip("matplotlib")
    from hilbert_hpc.study.report_files import PNG_SOFTWARE, is_report_png

    plots = study["dir"] / "plots"
    refused([study["results"]], "--plot", "not a folder", plot_dir=study["results"])
    refused([study["results"]], "--plot", "output parts folder", plot_dir=parts_dir(study["results"]))
    plots.mkdir()
    (plots / "strong_scaling.png").write_bytes(b"\x89PNG\r\n\x1a\nsomeone else's figure")
    before = digest(study["dir"])
    refused([study["results"]], "--plot", "not a plot written by hilbert-hpc report", plot_dir=plots,
            overwrite=True)
    assert digest(study["dir"]) == before
    (plots / "strong_scaling.png").unlink()
    tables = report([study["results"]], stream=io.StringIO(), plot_dir=plots)
    pngs = [Path(p) for p in tables["plots"]]
    assert [p.name for p in pngs] == ["strong_scaling.png", "accuracy_ranks.png"]
    assert all(is_report_png(png) and PNG_SOFTWARE.encode() in png.read_bytes() for png in pngs)
    refused([study["results"]], "--plot", "exists; replace it with --overwrite", plot_dir=plots)
    report([study["results"]], stream=io.StringIO(), plot_dir=plots, overwrite=True)
    assert sorted(p.name for p in plots.iterdir()) == ["accuracy_ranks.png", "strong_scaling.png"]


def test_cli_refusal_is_one_line_with_nothing_on_stdout(study):
    before = digest(study["dir"])
    res = cli(["report", "r.h5", "--csv", "r.h5", "--overwrite"], study["dir"])
    assert res.returncode == 2 and res.stdout == "", (res.returncode, res.stdout, res.stderr)
    assert res.stderr.splitlines() == [f"hilbert-hpc: error: --csv: 'r.h5' is the file given to report; it is "
                                       f"never replaced: choose another --csv"]
    assert digest(study["dir"]) == before


def test_bandwidth_files_carry_provenance_and_are_reported(tmp_path):
    res = cli(["bandwidth", "--max-bytes", "4096", "--iterations", "2", "-o", "bw.h5"], tmp_path, mpi=2)
    assert res.returncode == 0, res.stderr
    with h5py.File(tmp_path / "bw.h5") as f:
        for key in ("git_hash", "version", "command_line", "host", "hosts", "cpu", "versions", "started_utc",
                    "finished_utc"):
            assert key in f.attrs, key
        assert f.attrs["ranks"] == 2 and json.loads(f.attrs["versions"])["numpy"] == np.__version__
        assert f.attrs["study"] == "bandwidth" and f["bandwidth"].shape == (3, 2)
    results = write_results(tmp_path / "r.h5", [make_case("a", np.ones((1, 2)))])
    out = tmp_path / "all.csv"
    stream = io.StringIO()
    tables = report([tmp_path / "bw.h5", results], stream=stream, csv_path=out)
    text = stream.getvalue()
    assert [(r["bytes"], r["transport"], r["device"], r["ranks"]) for r in tables["bandwidth"]] == \
        [(1024, "host", "cpu", 2), (2048, "host", "cpu", 2), (4096, "host", "cpu", 2)]
    assert all(r["gb_per_s"] > 0 for r in tables["bandwidth"])
    assert "bandwidth (ring exchange" in text and "host cpu P=2 GB/s" in text and "4 KiB" in text
    assert "1 case(s), 1 bandwidth sweep(s) from 2 file(s)" in text
    rows = [line.split(",") for line in out.read_text().splitlines()]
    assert sum(r[0] == "bandwidth" for r in rows) == 3 and "gb_per_s" in rows[0]
    only = report([tmp_path / "bw.h5"], stream=io.StringIO())      # a bandwidth file alone is a report too
    assert len(only["bandwidth"]) == 3 and only["cases"] == []
